#!/bin/sh
# One shot (compose service / k8s Job `model-init`): build the base (and reference) model
# into the shared models volume, once. A fresh tiny model (`tba model init`), then the
# short supervised warm-up (`tba model sft`) unless MODEL_SFT=0. Atomic: the model
# appears at $TBA_MODEL by rename only when complete, so a restarted Job starts over
# cleanly and trainer and searchers never see half a model. A model already there
# (built before, or copied in by hand) is kept.
set -eu
dest="${TBA_MODEL:-/models/base}"
if [ -f "$dest/config.json" ]; then
    echo "model-init: $dest is there"
    exit 0
fi
rm -rf "$dest.init" "$dest.tmp"
tba model init --out "$dest.init" --seed "${TBA_SEED:-0}"
if [ "${MODEL_SFT:-1}" = 0 ]; then
    mv "$dest.init" "$dest.tmp"
else
    tba model sft --base "$dest.init" --out "$dest.tmp" --task "${TBA_TASK:-arithmetic}" --seed "${TBA_SEED:-0}"
    rm -rf "$dest.init"
fi
mv "$dest.tmp" "$dest"
echo "model-init: wrote $dest"
