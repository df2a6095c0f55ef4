"""Every Redis key, stream and channel name, in one place.

Keys that belong to one prompt carry the prompt in a hash tag
(``{p:<prompt_id>}``), so that on Redis Cluster all of one prompt's keys live
in one slot and the per-prompt Lua script stays single-slot. Global indexes
(the prompt sets, counters) and the two streams share the ``{g}`` tag, so the
global step can apply a batch and acknowledge its stream entries in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

# Field of a trajectory-stream entry that holds the msgpack-encoded ScoredGroup.
STREAM_FIELD = "g"
# Fields of the buffer's counters (``Keys.stats``) that the searchers read too, to tell how far generation runs
# ahead of training: every generated sample taken in (duplicates included), the duplicates among them, and every
# sample served (repeats included).
SAMPLES_TAKEN_IN = "samples_ingested"
SAMPLES_DUPLICATE = "samples_duplicate"
SAMPLES_SERVED = "samples_served"


@dataclass(frozen=True)
class Keys:
    """Names under one namespace (``TBA_NAMESPACE``), so several runs can share a Redis."""

    ns: str = "tba"

    # --- trajectory stream (searchers -> buffer) ---
    @property
    def trajectories(self) -> str:
        return f"{self.ns}:{{g}}:stream:trajectories"

    @property
    def dead_letters(self) -> str:
        return f"{self.ns}:{{g}}:stream:dead-letters"

    @property
    def ingest_group(self) -> str:
        """Consumer group of the buffer replicas on the trajectory stream."""
        return "buffer"

    # --- checkpoint announcements (trainer -> searchers) ---
    @property
    def checkpoint_channel(self) -> str:
        return f"{self.ns}:checkpoints"

    @property
    def latest_manifest(self) -> str:
        return f"{self.ns}:checkpoints:latest"

    # --- checkpoint leases (searchers hold them, the trainer's pruning honours them): one slot ---
    @property
    def checkpoint_leases(self) -> str:
        """Sorted set: ``<holder>\\n<directory>`` -> the Redis time its lease expires."""
        return f"{self.ns}:{{ckpt}}:leases"

    @property
    def checkpoint_pruning(self) -> str:
        """Sorted set: checkpoint directory -> the Redis time the trainer began deleting it."""
        return f"{self.ns}:{{ckpt}}:pruning"

    # --- buffer storage: global indexes share one slot ---
    def global_key(self, name: str) -> str:
        return f"{self.ns}:{{g}}:{name}"

    @property
    def stats(self) -> str:
        """Hash of the buffer's counters, in samples and groups."""
        return self.global_key("stats")

    @property
    def objective(self) -> str:
        """The run's pinned objective: sampling temperature and reference model identity."""
        return self.global_key("objective")

    # --- buffer storage: one prompt's keys share one slot ---
    def prompt_key(self, prompt_id: str, name: str) -> str:
        return f"{self.ns}:{{p:{prompt_id}}}:{name}"
