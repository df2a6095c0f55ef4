#!/usr/bin/env bash
# The pinned CPU build of PyTorch (requirements/cpu.txt), installed with the pip given (bootstrap.sh passes
# its venv's). PyPI does not carry it: pip looks first where its own settings point (PIP_INDEX_URL,
# PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, a pip.conf: a local wheel folder, a mirror), then at PyTorch's CPU
# index (TORCH_INDEX_URL, default below), so the first command works on a machine whose pip knows only PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

PIP="${1:?usage: scripts/install-torch.sh PIP}"
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
TORCH="$(grep -m1 '^torch==' requirements/cpu.txt)"

configured="$(mktemp)"
trap 'rm -f "$configured"' EXIT
# pip's own words stay quiet unless both tries fail: on most machines the first one is expected to.
if "$PIP" install -q --no-deps "$TORCH" >"$configured" 2>&1; then exit 0; fi
echo "bootstrap: $TORCH is not where pip's settings point; trying PyTorch's CPU index, $TORCH_INDEX_URL"
if "$PIP" install -q --no-deps --index-url "$TORCH_INDEX_URL" "$TORCH"; then exit 0; fi
{
    echo "bootstrap: what pip said where its settings point:"
    sed 's/^/bootstrap:   /' "$configured"
    echo "bootstrap: pip found no wheel for $TORCH, the CPU build of PyTorch (not on PyPI), where its settings"
    echo "bootstrap: point nor at $TORCH_INDEX_URL. Give it a copy of that index, or a folder holding the wheel:"
    echo "bootstrap:   TORCH_INDEX_URL=<index> make install    or    PIP_FIND_LINKS=<folder> make install"
} >&2
exit 1
