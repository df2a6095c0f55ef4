"""Reading back what Weights & Biases wrote offline: the records of a ``run-<id>.wandb`` file.

The file is W&B's transaction log: a 7-byte header (``:W&B``, a 2-byte magic, a version byte),
then LevelDB's log format (32 KiB blocks of chunks, each with a 7-byte header: CRC32C, length,
type FULL / FIRST / MIDDLE / LAST) holding serialised ``wandb_internal_pb2.Record`` messages.
wandb itself reads it only from Go, so the tests read it here (checksums not verified).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # the block's tail is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left_in_block
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def read_run(path: Path, timeout: float = 30.0) -> dict[str, Any]:
    """A run's group, job type and history rows (each a dict of key -> value) from its .wandb file.

    W&B's own service process writes the file, and may still be writing it when ``finish()`` has
    returned in the process that logged: the run is read once its exit record is in."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + timeout
    while True:
        parsed = [pb.Record.FromString(raw) for raw in records(path)]
        kinds = [rec.WhichOneof("record_type") for rec in parsed]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    run: dict[str, Any] = {"history": [], "complete": "exit" in kinds}
    for rec, kind in zip(parsed, kinds, strict=True):
        if kind == "run":
            run.update(group=rec.run.run_group, job_type=rec.run.job_type, name=rec.run.display_name)
        elif kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in rec.history.item}
            run["history"].append(row)
    return run
