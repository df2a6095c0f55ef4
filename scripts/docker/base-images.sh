#!/usr/bin/env bash
# Make the base images the Dockerfiles start FROM, locally, for machines that reach
# no image registry (docs/operations.md §7): a Debian bookworm root filesystem from
# debootstrap, imported and tagged with the public name the Dockerfiles default to,
# and a Redis image built on it. Docker keeps them, so a second run takes a second.
#
#   scripts/docker/base-images.sh            # make what is missing
#   FORCE=1 scripts/docker/base-images.sh    # remake them
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON_BASE="${PYTHON_BASE_IMAGE:-python:3.11-slim-bookworm}"
REDIS_IMAGE="${REDIS_IMAGE:-redis:7.0-bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
LABEL="org.tba.local-base=1"

mirror() {
    # The Debian mirror this machine's apt uses (deb822 or one-line sources).
    local m
    m=$(grep -hsE '^URIs: .*/debian/?$' /etc/apt/sources.list.d/*.sources | head -1 | awk '{print $2}')
    [ -n "$m" ] || m=$(grep -hsE '^deb .*/debian/? ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | head -1 | awk '{print $2}')
    echo "${m:-http://deb.debian.org/debian}"
}

have_local() { [ "$(docker image inspect -f '{{index .Config.Labels "org.tba.local-base"}}' "$1" 2>/dev/null)" = 1 ]; }

if [ -z "${FORCE:-}" ] && have_local "$PYTHON_BASE"; then
    echo "base-images: $PYTHON_BASE is there (local debootstrap build)"
else
    command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
    rootfs=$(mktemp -d /var/tmp/tba-rootfs.XXXXXX)
    # --one-file-system: never follow a proc/sys mount an interrupted debootstrap left inside.
    trap 'rm -rf --one-file-system "$rootfs" "$rootfs.log"' EXIT
    start=$(date +%s)
    echo "base-images: debootstrap $SUITE from $(mirror) (about 2 minutes)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$SUITE" "$rootfs" "$(mirror)" > "$rootfs.log" 2>&1 \
        || { tail -20 "$rootfs.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import \
        --change "LABEL $LABEL" --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' \
        - "$PYTHON_BASE" >/dev/null
    rm -f "$rootfs.log"
    echo "base-images: $PYTHON_BASE made in $(( $(date +%s) - start )) s"
fi

if [ -z "${FORCE:-}" ] && have_local "$REDIS_IMAGE"; then
    echo "base-images: $REDIS_IMAGE is there (local build)"
else
    docker build -q --build-arg "BASE_IMAGE=$PYTHON_BASE" --label "$LABEL" -t "$REDIS_IMAGE" \
        -f scripts/docker/redis.Dockerfile scripts/docker >/dev/null
    echo "base-images: $REDIS_IMAGE built from $PYTHON_BASE"
fi
