"""log pi_ref(y|x) on the trainer (``TBA_REF_PASS=trainer``), for the samples that arrive without it.

Where the searchers leave the reference pass to the trainer, they generate and score rewards only: on a
host whose searchers are the bottleneck (a core of search beside a core of training) that moves a
forward pass per sample off the critical path and onto a trainer that otherwise waits for data. The
trainer computes it per micro-batch, by the very function and precision of its policy's log-probs, with

- full fine-tuning: a frozen copy of the base model (``TBA_MODEL``);
- LoRA: the policy itself with its adapters switched off, which IS the base model: no second copy.

One trainer process only: under torchrun the ranks' sharded forwards must line up, and a pass only some
ranks need would not (the trainer refuses the combination at start-up).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from tba.model.reference import load_reference_model


class TrainerReference:
    """The reference model as the learner's forward needs it: :meth:`model` gives it for one pass."""

    def __init__(self, policy: torch.nn.Module, base: str, lora: bool, device: torch.device | str) -> None:
        self.policy = policy
        self.frozen = None if lora else load_reference_model(base, "float32", device)

    @contextlib.contextmanager
    def model(self) -> Iterator[torch.nn.Module]:
        """The reference, in eval mode, gradients off; for LoRA the policy with its adapters disabled
        (its train/eval mode put back after)."""
        with torch.no_grad():
            if self.frozen is not None:
                yield self.frozen
                return
            training = self.policy.training
            self.policy.eval()
            try:
                with self.policy.disable_adapter():  # type: ignore[operator]  # a peft PeftModel
                    yield self.policy
            finally:
                self.policy.train(training)
