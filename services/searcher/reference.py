"""The reference model's log-probs, log pi_ref(y|x) under logits/T, as the trainer computes them.

The trainer's definition (:func:`tba.model.logprobs.sequence_logprobs`) on the base model: the sum
over the completion ids (EOS included when emitted) of log softmax(logits / T) at the token that
follows. The pass here, :func:`tba.model.logprobs.shared_prefix_logprobs_chunked`, returns the same sums
(to float rounding) but feeds each prompt once with the trie of its completions, so the S
completions of a prompt and their shared first tokens are computed once: on the arithmetic SFT base
a batch costs about a fifth of the token positions of one row per completion.

On a CPU host it runs on the searcher's scoring thread, which :mod:`services.searcher.cpus` puts
on the cores the generation worker leaves, below generation's priority: scoring batch i overlaps
generating batch i+1. On GPU hosts it runs on ``ref_device``. With ``TBA_REF_PASS=trainer`` the searcher
loads no reference model and the trainer scores the samples (:mod:`services.trainer.reference`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from services.searcher.cpus import spare_cpus
from tba.settings import SearcherSettings

log = logging.getLogger(__name__)


class Reference:
    """The base model, loaded once, scoring (prompt, completion) pairs."""

    def __init__(self, settings: SearcherSettings, pad_id: int) -> None:
        import torch

        from tba.model.reference import load_reference_model

        self.settings = settings
        self.pad_id = pad_id
        self.model = load_reference_model(settings.model, settings.dtype, settings.ref_device)
        if torch.device(settings.ref_device).type == "cpu":
            # The generation worker has its own cores: more threads than the spare ones would take from it.
            torch.set_num_threads(settings.ref_threads or max(1, len(spare_cpus())))

    def logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        scored: Sequence[Sequence[bool]] | None = None,
    ) -> list[float]:
        """log pi_ref(y_i|x_i) under logits/T for each pair, in order, summed over the model's tokens only
        (``scored``, multi-turn: the environment's tokens are context)."""
        from tba.model.logprobs import shared_prefix_logprobs_chunked

        return shared_prefix_logprobs_chunked(
            self.model,
            prompt_ids,
            completion_ids,
            self.settings.temperature,
            self.pad_id,
            self.settings.ref_token_budget,
            scored,
        )
