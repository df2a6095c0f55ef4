"""The buffer's Lua scripts (``services/buffer/lua/*.lua``), read once at import and registered with Redis.

Every write that must be atomic happens inside one of them, and each touches the keys of **one hash
slot** only, so the same scripts run on a single Redis and on Redis Cluster:

- ``prompt_step.lua`` changes one prompt's keys, slot ``{p:<id>}``; ``read_prompt.lua`` reads them;
- ``global_step.lua``, ``record_intent.lua``, ``plan_eviction.lua``, ``dead_letter.lua``,
  ``pin_objective.lua`` and ``pick_prompts.lua`` use the shared indexes and counters, slot ``{g}``,
  where the trajectory and dead-letter streams also live (so an entry's ack is part of the global step).

Each file is a whole script but for what every script shares, ``prelude.lua``: :func:`compose` puts
it after the script's ``#!lua`` line (which must stay first: it carries the script's flags), after
the one constant the scripts share with Python, :data:`VERSION_SHIFT`; the line numbers in a Redis
script error are therefore those of ``compose(name)``, not of the file. A script file that is missing
(a package built without its data files) fails the import, so the service does not start.

The keys the scripts maintain, and what each holds, are listed in docs/architecture.md §3;
:mod:`services.buffer.store` tells how a write's two steps fit together.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from redis.asyncio.cluster import RedisCluster

LUA_DIR = Path(__file__).with_name("lua")

# A sample's order score is ``version * VERSION_SHIFT + arrival``: the version sits above a 32-bit
# arrival counter, so the lowest score is the oldest version, then the oldest arrival, across prompts
# too. Versions stay below 2**21 (tba.schemas.MAX_VERSION, enforced on every message), so that every
# score is an integer a double holds exactly (< 2**53).
VERSION_SHIFT = 2**32


def read_lua(name: str) -> str:
    path = LUA_DIR / name
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuntimeError(
            f"the buffer's Lua script {path} is missing: the package was built without "
            f"services/buffer/lua/*.lua (package data in pyproject.toml)"
        ) from None


# The fields of one item of global_step.lua's ARGV, in order: the one place they are named. The store
# builds each item from them (services/buffer/store.py, ``_Item``), the script reads each by name through
# the ``ITEM`` offsets :func:`compose` gives it.
GLOBAL_ITEM_FIELDS = ("kind", "group_id", "token", "entry_id", "prompt_id", "samples", "label", "delta", "fresh")


def lua_offsets(name: str, fields: tuple[str, ...]) -> str:
    """``local NAME = {a = 0, b = 1, ...}`` and ``local NAME_SIZE = n``: a record's layout in ARGV, for Lua."""
    offsets = ", ".join(f"{field} = {i}" for i, field in enumerate(fields))
    return f"local {name} = {{{offsets}}}\nlocal {name}_SIZE = {len(fields)}"


def compose(name: str, constants: str = "") -> str:
    """The script ``lua/<name>``, ready for Redis: its ``#!lua`` line, the shared constant and the script's own
    (``constants``), the prelude, its body."""
    first, _, body = read_lua(name).partition("\n")
    if not first.startswith("#!lua"):
        raise RuntimeError(f"{LUA_DIR / name} must start with a '#!lua' line (its flags)")
    own = f"{constants}\n" if constants else ""
    return f"{first}\nlocal VERSION_SHIFT = {VERSION_SHIFT}\n{own}{PRELUDE}\n{body}"


PRELUDE = read_lua("prelude.lua")
PROMPT_STEP = compose("prompt_step.lua")
GLOBAL_STEP = compose("global_step.lua", lua_offsets("ITEM", GLOBAL_ITEM_FIELDS))
RECORD_INTENT = compose("record_intent.lua")
PLAN_EVICTION = compose("plan_eviction.lua")
DEAD_LETTER = compose("dead_letter.lua")
PIN_OBJECTIVE = compose("pin_objective.lua")
PICK_PROMPTS = compose("pick_prompts.lua")
READ_PROMPT = compose("read_prompt.lua")


class Scripts:
    """The scripts registered with one Redis client: ``await scripts.prompt_step(keys=..., args=...)``.

    A registered script runs by its digest and is loaded on first use; :meth:`load` loads them all
    on every node up front, so that pipelines need no NOSCRIPT round trip."""

    def __init__(self, redis: Any) -> None:
        self.prompt_step = redis.register_script(PROMPT_STEP)
        self.global_step = redis.register_script(GLOBAL_STEP)
        self.record_intent = redis.register_script(RECORD_INTENT)
        self.plan_eviction = redis.register_script(PLAN_EVICTION)
        self.dead_letter = redis.register_script(DEAD_LETTER)
        self.pin_objective = redis.register_script(PIN_OBJECTIVE)
        self.pick_prompts = redis.register_script(PICK_PROMPTS)
        self.read_prompt = redis.register_script(READ_PROMPT)
        self._redis = redis

    async def load(self) -> None:
        for script in (
            self.prompt_step,
            self.global_step,
            self.record_intent,
            self.plan_eviction,
            self.dead_letter,
            self.pin_objective,
            self.pick_prompts,
            self.read_prompt,
        ):
            await self._redis.script_load(script.script)

    async def many(self, script: Any, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run one script for many (keys, args): pipelined on one Redis; concurrently on a cluster, whose
        pipelines refuse scripts. A failed call's exception takes its place in the answers."""
        if isinstance(self._redis, RedisCluster):
            return list(await asyncio.gather(*(script(keys=k, args=a) for k, a in calls), return_exceptions=True))
        pipe = self._redis.pipeline(transaction=False)
        for keys, args in calls:
            await script(keys=keys, args=args, client=pipe)
        return await pipe.execute(raise_on_error=False)
