"""Scored groups as plain dicts, the shape a searcher puts on the wire, built without pydantic.

The soak's producers send thousands of groups a second on a 2-core machine: building and
validating a :class:`tba.schemas.ScoredGroup` for each would cost more than the buffer's work on
it, so they pack these dicts with msgpack directly. The fuzz suite starts its poison entries from
the same dict and breaks one thing at a time.
"""

from __future__ import annotations

from typing import Any

from tba.schemas import SCHEMA_VERSION

# The objective every group here states: the buffer pins the first one it sees, and refuses other ones.
TEMPERATURE, REFERENCE = 0.7, "reliability-reference"


def group_dict(
    group_id: str,
    prompt_id: str,
    completions: list[list[int]],
    rewards: list[float],
    version: int = 0,
    searcher_id: str = "reliability",
) -> dict[str, Any]:
    """A valid ScoredGroup: one sample per completion, each with its reward and plausible log-probs."""
    return {
        "schema_version": SCHEMA_VERSION,
        "group_id": group_id,
        "prompt_id": prompt_id,
        "prompt_text": f"prompt {prompt_id}",
        "prompt_ids": [1, 2, 3, 4],
        "task": "arithmetic",
        "policy_version": version,
        "searcher_id": searcher_id,
        "created_at": 1.7e9,
        "temperature": TEMPERATURE,
        "reference": REFERENCE,
        "samples": [
            {
                "completion_ids": ids,
                "completion_text": "x" * len(ids),
                "reward": reward,
                "logprob_sum": -float(len(ids)),
                "ref_logprob_sum": -float(len(ids)) - 0.5,
                "finish_reason": "stop",
            }
            for ids, reward in zip(completions, rewards, strict=True)
        ],
    }
