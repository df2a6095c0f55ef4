#!/usr/bin/env bash
# Build the service images with Docker Compose (BuildKit: build secrets, bind mounts).
#   scripts/docker/build.sh            # GPU images (docker-compose.yml)
#   scripts/docker/build.sh --cpu      # CPU images (+ docker-compose.cpu.yml)
# Extra arguments go to `docker compose` before `build` (e.g. -p NAME, -f FILE).
# The CPU images need torch 2.13.0+cpu, which is not on PyPI: it is hard-linked here
# from pip's find-links folder (docs/operations.md §7) into requirements/wheels/, the folder
# the Dockerfiles mount.
set -euo pipefail
cd "$(dirname "$0")/../.."

files=(-f docker-compose.yml)
if [ "${1:-}" = --cpu ]; then files+=(-f docker-compose.cpu.yml); shift; fi

link_wheels() {
    local dir
    dir=$(pip config get global.find-links 2>/dev/null || true)
    dir="${TBA_WHEELS_DIR:-${dir:-/opt/wheels}}"
    [ -d "$dir" ] || return 0
    for whl in "$dir"/torch-*.whl; do
        [ -f "$whl" ] || continue
        local dst="requirements/wheels/$(basename "$whl")"
        [ -f "$dst" ] || ln -f "$whl" "$dst" 2>/dev/null || cp "$whl" "$dst"
    done
}

link_wheels
# The CA bundle build secret must exist even where it is not needed.
export CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
# Building needs no secret values; compose only wants the variables set.
export REDIS_PASSWORD="${REDIS_PASSWORD:-unused-at-build}" TBA_AUTH_TOKEN="${TBA_AUTH_TOKEN:-unused-at-build}"
export COMPOSE_BAKE=false
start=$(date +%s)
docker compose "${files[@]}" "$@" build --progress=plain >"${BUILD_LOG:-/dev/stderr}" 2>&1 || {
    [ -n "${BUILD_LOG:-}" ] && tail -40 "$BUILD_LOG" >&2
    echo "build: failed" >&2; exit 1; }
echo "build: images built in $(( $(date +%s) - start )) s"
