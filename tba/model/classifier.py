"""The red-teaming task's judge: a small sequence classifier the project trains itself.

The paper's red-teaming reward is a toxicity classifier's score of the target's reply. The CPU
stand-in flags a property the tiny arithmetic model rarely produces: a completion that contains a
given digit pattern (``77`` by default; under 2 % of the base model's samples, since few sums hold
it). The judge is a learned model, not the rule: a small convolutional sequence classifier over the
tiny model's character vocabulary (embeddings, two convolutions, a max over positions), trained
on strings labelled by the rule (digit strings with and
without the pattern, near misses such as ``7x7``, and arbitrary text), so its score is what a
policy is rewarded by and has to find, as a real classifier's would be.

Built once per pattern (seconds) and cached beside the SFT base models
(``tba.model.cache.default_cache_root``): weights as safetensors, the tokenizer, and ``judge.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

CODE_VERSION = 1  # bump when the data or the training below change: the cache key changes with it
STEPS, BATCH, LR = 500, 128, 3e-3
_TEXT = "0123456789+-=() abcxyz"


def labelled_strings(pattern: str, n: int, rng: random.Random) -> list[tuple[str, int]]:
    """``n`` (text, label) pairs, label 1 when ``pattern`` occurs in the text: half positives, a quarter
    random digit strings, a quarter near misses (the pattern's characters apart) and arbitrary text."""
    out: list[tuple[str, int]] = []
    while len(out) < n:
        kind = rng.random()
        length = rng.randint(1, 12)
        digits = "".join(rng.choice("0123456789") for _ in range(length))
        if kind < 0.5:
            at = rng.randint(0, len(digits))
            text = digits[:at] + pattern + digits[at:]
        elif kind < 0.75:
            text = digits
        elif kind < 0.875:
            gap = rng.choice("0123456789+ ")
            text = digits[: length // 2] + pattern[0] + gap + pattern[1:] + digits[length // 2 :]
        else:
            text = "".join(rng.choice(_TEXT) for _ in range(length + 2))
        out.append((text[:16], int(pattern in text[:16])))
    return out


def classifier_dir(pattern: str, cache_root: Path | None = None) -> Path:
    from tba.model.cache import default_cache_root

    key = hashlib.sha256(json.dumps({"pattern": pattern, "code": CODE_VERSION}).encode()).hexdigest()[:16]
    return (cache_root or default_cache_root()) / f"redteam-judge-{key}"


def ensure_classifier(pattern: str = "77", cache_root: Path | None = None, log=print) -> Path:
    """The judge for ``pattern``: from the cache, or trained now (about a minute on one core)."""
    if not pattern or not pattern.isdigit() or len(pattern) > 4:
        raise ValueError(f"pattern must be 1 to 4 digits, got {pattern!r}")
    final = classifier_dir(pattern, cache_root)
    if (final / "judge.json").is_file():
        return final
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    accuracy = train_classifier(pattern, tmp, log)
    (tmp / "judge.json").write_text(json.dumps({"pattern": pattern, "held_out_accuracy": accuracy}))
    try:
        tmp.rename(final)
    except OSError:  # another process finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _network(vocab: int) -> Any:
    """Character embeddings, two convolutions (a window of 5 characters) and a max over positions."""
    from torch import nn

    class CharCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, 32, padding_idx=0)
            self.conv1 = nn.Conv1d(32, 64, 3, padding=1)
            self.conv2 = nn.Conv1d(64, 64, 3, padding=1)
            self.out = nn.Linear(64, 2)

        def forward(self, ids: Any) -> Any:  # (B, L) token ids, 0 = padding -> (B, 2) logits
            x = self.embed(ids).transpose(1, 2)
            x = self.conv2(self.conv1(x).relu()).relu()
            x = x.masked_fill((ids == 0).unsqueeze(1), float("-inf")).amax(-1)
            return self.out(x)

    return CharCNN()


def _encode(tok: Any, texts: list[str]) -> Any:
    """Padded token ids (no special tokens; at least one position, so an empty text scores too)."""
    from tba.model.batches import pad

    ids = [tok.encode(t[:48], add_special_tokens=False) or [tok.unk_token_id] for t in texts]
    return pad(ids, tok.pad_token_id)[0]


def train_classifier(pattern: str, out: Path, log=print, seed: int = 0) -> float:
    """Train the judge into ``out``; returns its accuracy on 4,000 held-out strings (at least 99.5 %)."""
    import torch
    from safetensors.torch import save_file

    from tba.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    assert tok.pad_token_id == 0, "the judge masks padding as id 0"
    torch.manual_seed(seed)
    model = _network(len(tok))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    rng = random.Random(seed)
    for step in range(STEPS):
        pairs = labelled_strings(pattern, BATCH, rng)
        loss = torch.nn.functional.cross_entropy(
            model(_encode(tok, [t for t, _ in pairs])), torch.tensor([y for _, y in pairs])
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 250 == 0:
            log(f"judge: step {step} loss {loss.item():.4f}")
    pairs = labelled_strings(pattern, 4000, random.Random(seed + 1))
    with torch.no_grad():
        predicted = model(_encode(tok, [t for t, _ in pairs])).argmax(-1)
    accuracy = float((predicted == torch.tensor([y for _, y in pairs])).float().mean())
    if accuracy < 0.995:
        raise RuntimeError(f"the judge for {pattern!r} reached only {accuracy:.1%} held-out accuracy")
    out.mkdir(parents=True, exist_ok=True)
    save_file(model.state_dict(), str(out / "judge.safetensors"))
    tok.save_pretrained(out)
    log(f"judge: {pattern!r} classifier, held-out accuracy {accuracy:.2%}, in {out}")
    return accuracy


class Judge:
    """Loads the judge once and scores texts: the probability that each has the flagged property."""

    def __init__(self, model_dir: Path, batch_size: int = 512) -> None:
        from safetensors.torch import load_file

        from tba.model.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer(model_dir)
        self.model = _network(len(self.tokenizer))
        self.model.load_state_dict(load_file(str(Path(model_dir) / "judge.safetensors")))
        self.model.eval()
        self.batch_size = batch_size

    def scores(self, texts: list[str]) -> list[float]:
        import torch

        out: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                logits = self.model(_encode(self.tokenizer, texts[start : start + self.batch_size]))
                out += logits.softmax(-1)[:, 1].tolist()
        return out
