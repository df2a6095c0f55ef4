"""The trainer as N ranks under ``torchrun``: FSDP2 sharding, one batch split by prompt, full checkpoints.

``TBA_TRAINER_PROCS=N tba trainer`` runs itself again under ``torchrun --nproc-per-node N`` (several
nodes: run torchrun yourself, k8s/README.md); the launcher's environment (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``) says which copy each is. One process (``WORLD_SIZE`` unset or 1) is the
plain trainer: nothing here runs.

Who does what:

* Rank 0 is the only one that talks to the outside: it waits for the warm-up, fetches each batch from
  the buffer, publishes checkpoints and announces them, serves health and metrics. One client means
  one sampling decision per step, exactly as with one process (N ranks fetching their own shares would
  draw N independent batches, and the buffer's sampling rule would be applied N times). The batch is
  small next to a step's compute; rank 0 sends it to the others (:meth:`Ranks.broadcast`).
* Every rank holds a shard of the model (``fully_shard`` on each decoder layer, then the whole model)
  and of the optimizer state, and computes the loss on its share of the batch: whole prompts
  (:func:`split_by_prompt`), so every TB group and its log Z stay on one rank.
* Gradients: each rank's loss is its samples' sum divided by the *whole* batch's sample count, times
  the number of ranks, which FSDP's reduction (a mean over ranks) divides out again: the update is
  the one-process update on the whole batch, up to the order of floating-point additions.
* FSDP gathers each layer's weights in every forward and backward, so all ranks must run the same
  number of micro-batches: a rank with fewer runs forwards weighted zero (``Learner.accumulate``).
* A checkpoint is gathered into one full state dict on rank 0 (the same Hugging Face directory a
  single process writes) with the optimizer state keyed by parameter name, so a run can resume on any
  number of ranks.

A rank that dies breaks the others' next collective; ``torchrun`` then stops the whole group and exits
non-zero, and whatever restarts the trainer (:func:`launcher`) starts it again: every rank resumes from
the newest checkpoint.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from services.trainer.batching import Row, group_by_prompt
from tba.procs import die_with_parent

log = logging.getLogger(__name__)
# The longest a rank waits for the others, rank 0's waits for the buffer included. A rank that dies is noticed
# by torchrun at once (it stops the others), so this only bounds a rank that hangs.
COLLECTIVE_TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the trainer's ranks."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls) -> Ranks:
        return cls(
            int(os.environ.get("RANK", "0")),
            int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")),
        )

    def start(self, device: str) -> str:
        """Join the process group (NCCL on GPUs, gloo on the CPU); returns this rank's device."""
        import torch.distributed as dist

        if not self.distributed:
            return device
        # torchrun starts each rank in a session of its own, so a signal to the launcher's process group (a
        # supervisor's stop, a container's) reaches the ranks only through torchrun, and a torchrun killed
        # with SIGKILL would leave them running: they die with it instead.
        die_with_parent()
        on_gpu = device.startswith("cuda")
        if on_gpu:
            device = f"cuda:{self.local_rank}"
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=COLLECTIVE_TIMEOUT)
        log.info("trainer rank %d of %d on %s", self.rank, self.world, device)
        return device

    def stop(self, clean: bool = True) -> None:
        """Leave the process group: together with the others on a clean stop (a rank that tears its group down
        while another still uses it aborts); after a failure, at once (torchrun stops the others)."""
        import torch.distributed as dist

        if dist.is_initialized():
            if clean:
                dist.barrier()
            dist.destroy_process_group()

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; the others' argument is ignored)."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


ONE_PROCESS = Ranks()


def launcher(procs: int) -> list[str]:
    """The command that starts ``procs`` ranks on this host, before ``-m tba.cli trainer ...``.

    A rank that dies makes torchrun stop the others and exit non-zero; whatever restarts the trainer (the
    supervisor of ``tba up``, a container's restart policy) starts it again and every rank resumes from
    the newest checkpoint. torchrun's own in-place restarts (``--max-restarts``) are not used: with gloo
    (torch 2.13) the restarted ranks hung in their rendezvous in 2 of 3 tries here."""
    if procs <= 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]


def split_by_prompt(rows: list[Row], world: int) -> list[list[Row]]:
    """The batch's rows in ``world`` shares of whole prompts, balanced by tokens (largest prompt first, each to
    the lightest share). Deterministic: every rank computes the same split from the same batch."""
    tokens = {key: (sum(r.length for r in group), group) for key, group in group_by_prompt(rows).items()}
    shares: list[list[Row]] = [[] for _ in range(world)]
    loads = [0] * world
    for key in sorted(tokens, key=lambda k: (-tokens[k][0], k)):
        i = loads.index(min(loads))
        shares[i].extend(tokens[key][1])
        loads[i] += tokens[key][0]
    return shares


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (Hugging Face decoders keep them in a ModuleList named ``layers``)."""
    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList) and len(module):
            return list(module)
    raise ValueError(f"{type(model).__name__}: no decoder layers (a ModuleList named 'layers') to shard")


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each decoder layer its own unit, then the rest (embeddings, final norm, output layer)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, ranks: Ranks, with_optimizer: bool = True
) -> tuple[dict, dict | None]:
    """(model state dict, optimizer state dict keyed by parameter name or None without ``with_optimizer``),
    whole, on CPU, on rank 0 (empty on the others). Every rank must call it with the same ``with_optimizer``:
    gathering the shards is a collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=ranks.distributed)
    model_state = model.state_dict() if not ranks.distributed else get_model_state_dict(model, options=options)
    if not with_optimizer:
        return model_state, None
    return model_state, get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict | None, ranks: Ranks
) -> None:
    """Restore an optimizer state saved by :func:`full_state` (rank 0 read it; the others pass None).

    One process maps the names back to its parameters itself; N ranks take their shards of it from rank 0.
    A state keyed by index (``optimizer.state_dict()``) loads as it is in one process."""
    if ranks.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        if ranks.main:
            assert saved is not None, "rank 0 restores the state it read"
        set_optimizer_state_dict(model, optimizer, optim_state_dict=saved if saved is not None else {}, options=options)
        return
    assert saved is not None
    if all(isinstance(k, int) for k in saved["state"]):
        optimizer.load_state_dict(saved)
        return
    names = {id(p): n for n, p in model.named_parameters()}
    index: dict[str, int] = {}
    groups = []
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        for p in group["params"]:
            index[names[id(p)]] = len(index)
        groups.append({**saved_group, "params": [index[names[id(p)]] for p in group["params"]]})
    missing = set(saved["state"]) - set(index)
    if missing:
        raise ValueError(f"the saved optimizer state has parameters this model lacks: {sorted(missing)[:3]}")
    optimizer.load_state_dict({"state": {index[n]: s for n, s in saved["state"].items()}, "param_groups": groups})
