#!/usr/bin/env bash
# The real container smoke run: engine, local base images, image builds, then the
# CPU stack with two searcher replicas under Docker Compose, training on the
# calculator served by the OpenEnv environment server (docker-compose.openenv.yml).
# It passes when
#   - the trainer has published at least 2 checkpoints,
#   - both searchers' groups (buffer GET /v1/stats "searcher_versions") carry a
#     version > 0, i.e. one they hot-reloaded,
#   - both searchers played episodes against the environment server (their
#     tba_searcher_episodes_total), and its log holds no traceback,
#   - `docker compose down` leaves no container, network or volume of the run.
# Traffic stays on this machine: the Compose network of the run, and the buffer
# published on an ephemeral 127.0.0.1 port.
#
#   scripts/docker-smoke.sh                 # SMOKE_TIMEOUT (s) bounds the run phase
#   SMOKE_REPORT=out.json scripts/docker-smoke.sh
#   scripts/docker-smoke.sh --build-only    # engine, base images and image builds only: fills the
#                                           # cache a later run builds from (the test suite's prewarm)
# Base images and built layers stay in Docker between runs: a warm run rebuilds
# only what changed. A dockerd started here is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_ONLY=0
case "${1:-}" in
    "") ;;
    --build-only) BUILD_ONLY=1 ;;
    *) echo "usage: $0 [--build-only]" >&2; exit 2 ;;
esac
PROJECT="${SMOKE_PROJECT:-tba-smoke}"
TIMEOUT="${SMOKE_TIMEOUT:-600}"
REPORT="${SMOKE_REPORT:-}"
LOG_DIR="${SMOKE_LOG_DIR:-$(mktemp -d /tmp/tba-smoke.XXXXXX)}"
mkdir -p "$LOG_DIR"
# On top of the CPU stack (build.sh --cpu adds docker-compose.yml and docker-compose.cpu.yml itself).
ON_TOP=(-f docker-compose.openenv.yml -f tests/deploy/compose.smoke.yml)
COMPOSE=(docker compose -p "$PROJECT" -f docker-compose.yml -f docker-compose.cpu.yml "${ON_TOP[@]}")

# Fresh secrets for this run only: never written to disk.
REDIS_PASSWORD="$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
TBA_AUTH_TOKEN="$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export REDIS_PASSWORD TBA_AUTH_TOKEN COMPOSE_BAKE=false
export IMAGE_TAG="${IMAGE_TAG:-latest}"
# The Redis image scripts/docker/base-images.sh makes (Debian's redis-server).
export REDIS_IMAGE="${REDIS_IMAGE:-redis:7.0-bookworm}"

t0=$(date +%s)
phase_start=$t0
declare -A took
phase() { local now; now=$(date +%s); took[$1]=$((now - phase_start)); phase_start=$now; echo "smoke: $1 took ${took[$1]} s"; }

# Why a container is not healthy, printed where CI keeps it (the log directory does not survive CI):
# its state, its last health probes and the end of its own log.
explain_unhealthy() {
    local id
    for id in $("${COMPOSE[@]}" ps -aq); do
        # Fine: running (healthy, or without a healthcheck), or a one-shot that exited 0 (model-init).
        case "$(docker inspect --format '{{.State.Status}} {{.State.ExitCode}} {{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id")" in
            "running 0 healthy" | "running 0 " | "exited 0 "*) continue ;;
        esac
        echo "--- $(docker inspect --format '{{.Name}}: {{.State.Status}}, exit {{.State.ExitCode}}, restarts {{.RestartCount}}, OOM-killed {{.State.OOMKilled}}' "$id")"
        docker inspect --format '{{if .State.Health}}{{range .State.Health.Log}}probe {{.Start}}: exit {{.ExitCode}} {{.Output}}{{end}}{{end}}' "$id"
        docker logs --tail 40 "$id" 2>&1 | cut -c1-300
    done
}

engine_started=0
had_engine=0
docker info >/dev/null 2>&1 && had_engine=1
cleanup() {
    local rc=$?
    if [ "${stack_up:-0}" = 1 ]; then
        "${COMPOSE[@]}" ps -a >"$LOG_DIR/ps.txt" 2>&1 || true
        "${COMPOSE[@]}" logs --no-color --timestamps >"$LOG_DIR/compose.log" 2>&1 || true
        "${COMPOSE[@]}" down -v --remove-orphans --timeout 30 >"$LOG_DIR/down.log" 2>&1 || true
    fi
    [ "$engine_started" = 1 ] && scripts/docker/engine.sh stop || true
    [ $rc = 0 ] || echo "smoke: FAILED; logs in $LOG_DIR" >&2
    exit $rc
}
trap cleanup EXIT

scripts/docker/engine.sh start
[ "$had_engine" = 0 ] && engine_started=1
phase engine

scripts/docker/base-images.sh
phase base_images

BUILD_LOG="$LOG_DIR/build.log" scripts/docker/build.sh --cpu -p "$PROJECT" "${ON_TOP[@]}"
phase build

# The buffer and environment server images must not carry the ML stack.
for image in buffer envserver; do
    if docker run --rm --entrypoint python3 "tba/$image:$IMAGE_TAG" -c \
        'import importlib.util as u, sys; sys.exit(0 if any(u.find_spec(m) for m in ("torch", "vllm", "transformers")) else 1)'; then
        echo "smoke: the $image image carries torch, vLLM or transformers" >&2; exit 1
    fi
done
if [ "$BUILD_ONLY" = 1 ]; then
    echo "smoke: images built in $(( $(date +%s) - t0 )) s (engine ${took[engine]}, base images ${took[base_images]}, build ${took[build]})"
    exit 0
fi

# What an interrupted earlier run left (containers that dockerd restarts, volumes with its checkpoints
# and Redis data) would make this run resume that one: start from nothing.
"${COMPOSE[@]}" down -v --remove-orphans --timeout 10 >"$LOG_DIR/preclean.log" 2>&1 || true
# Anonymous volumes (each searcher's spill queue) carry no project label: count them around the run.
dangling_before=$(docker volume ls -q --filter dangling=true | sort)
stack_up=1
# --wait: as `make up` does, return once every service is healthy (model-init: exited 0).
"${COMPOSE[@]}" up -d --wait --wait-timeout 900 --scale searcher=2 >"$LOG_DIR/up.log" 2>&1 \
    || { tail -30 "$LOG_DIR/up.log" >&2; explain_unhealthy >&2; exit 1; }
phase up

# Poll until the pass condition holds or the time runs out.
deadline=$(( $(date +%s) + TIMEOUT ))
versions_seen=""
passed=0
while [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 10
    probe=$("${COMPOSE[@]}" exec -T trainer python3 - <scripts/docker/smoke_probe.py 2>>"$LOG_DIR/probe.err" || true)
    [ -n "$probe" ] || { echo "smoke: +$(( $(date +%s) - phase_start )) s: trainer not up yet"; continue; }
    echo "$probe" >>"$LOG_DIR/probe.jsonl"
    verdict=$(python3 - "$probe" "$versions_seen" <<'PY'
import json, sys
p = json.loads(sys.argv[1])
seen = {int(v) for v in sys.argv[2].split()} | set(p.get("versions_on_disk") or [])
if p.get("manifest_version"):
    seen.add(p["manifest_version"])
sv = p.get("searcher_versions") or {}
reloaded = sorted(s for s, vs in sv.items() if any(int(v) > 0 for v in vs))
ok = len(seen) >= 2 and len(reloaded) >= 2
print(" ".join(map(str, sorted(seen))) + "|" + ("PASS" if ok else "wait")
      + f"|published {sorted(seen)}, searchers {dict((k, sorted(set(v))[-3:]) for k, v in sv.items())}")
PY
)
    versions_seen="${verdict%%|*}"
    rest="${verdict#*|}"
    echo "smoke: +$(( $(date +%s) - phase_start )) s: ${rest#*|}"
    if [ "${rest%%|*}" = PASS ]; then passed=1; break; fi
done
phase run
[ "$passed" = 1 ] || { echo "smoke: no pass within ${TIMEOUT} s (last probe: ${probe:-none})" >&2; exit 1; }

# Episodes each searcher played against the environment server, from its own metrics.
episodes=()
for i in 1 2; do
    episodes+=("$("${COMPOSE[@]}" exec -T --index "$i" searcher python3 -c '
import re, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:9400/metrics", timeout=10).read().decode()
found = re.search(r"^tba_searcher_episodes_total (\S+)$", text, re.M)
print(int(float(found.group(1))) if found else 0)' 2>>"$LOG_DIR/probe.err" || echo 0)")
done
echo "smoke: episodes per searcher: ${episodes[*]}"
for n in "${episodes[@]}"; do
    [ "$n" -gt 0 ] || { echo "smoke: a searcher played no episode against the environment server" >&2; exit 1; }
done
# Episodes end with the client's close: the server's log stays free of tracebacks.
if "${COMPOSE[@]}" logs --no-color envserver 2>&1 | grep -q Traceback; then
    "${COMPOSE[@]}" logs --no-color envserver 2>&1 | grep -m1 -B2 -A30 Traceback >&2
    echo "smoke: the environment server logged a traceback" >&2; exit 1
fi

# Health of every long-running service, as Docker sees it.
"${COMPOSE[@]}" ps --format '{{.Service}} {{.State}} {{.Health}}' | sort >"$LOG_DIR/health.txt"
cat "$LOG_DIR/health.txt"

"${COMPOSE[@]}" logs --no-color --timestamps >"$LOG_DIR/compose.log" 2>&1 || true
"${COMPOSE[@]}" down -v --remove-orphans --timeout 30 >"$LOG_DIR/down.log" 2>&1
stack_up=0
left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" | wc -l)
nets=$(docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)
vols=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT" | wc -l)
vols=$(( vols + $(comm -13 <(echo "$dangling_before") <(docker volume ls -q --filter dangling=true | sort) | grep -c . || true) ))
phase down
if [ "$left" != 0 ] || [ "$nets" != 0 ] || [ "$vols" != 0 ]; then
    echo "smoke: down left $left containers, $nets networks, $vols volumes" >&2; exit 1
fi

total=$(( $(date +%s) - t0 ))
echo "smoke: PASSED in $total s (engine ${took[engine]}, base images ${took[base_images]}, build ${took[build]}," \
     "up ${took[up]}, run ${took[run]}, down ${took[down]}); logs in $LOG_DIR"
if [ -n "$REPORT" ]; then
    python3 - "$REPORT" "$probe" "$versions_seen" <<PY
import json, sys
json.dump({"passed": True, "total_seconds": $total,
           "phases": {"engine": ${took[engine]}, "base_images": ${took[base_images]}, "build": ${took[build]},
                      "up": ${took[up]}, "run": ${took[run]}, "down": ${took[down]}},
           "versions_published": [int(v) for v in sys.argv[3].split()],
           "searcher_episodes": [int(n) for n in "${episodes[*]}".split()],
           "last_probe": json.loads(sys.argv[2]), "log_dir": "$LOG_DIR",
           "left_after_down": {"containers": $left, "networks": $nets, "volumes": $vols}},
          open(sys.argv[1], "w"), indent=2)
PY
fi
