"""The profile ``tba up`` runs with: the settings it chooses for each service over the services' own defaults.

They live in one file a user reads and can replace (``tba/local/profiles/default.toml``; ``tba up --profile
NAME|FILE``), not in code, so that ``tba trainer`` alone means what docs/configuration.md says and a run
under ``tba up`` differs from it only by what this file states. A TBA_ variable set in the environment wins
over the profile. The launcher adds only what follows from the run itself (its budget, its ports, where each
process runs: :mod:`tba.local.up`), and ``tba up --print-config`` shows all of it, each value with where it
comes from.

A profile is TOML: tables ``[all]``, ``[trainer]``, ``[searcher]``, ``[buffer]`` of ``TBA_NAME = value``, and
the same with a condition after a dot (``[searcher.shared-cores]``) applying only under it
(:data:`CONDITIONS`); ``base = "default"`` at the top applies the file over another profile; and ``[run]``,
what the run itself is (``tba up``'s flags of :data:`RUN_FLAGS`: the task,
the base model, the budget, the evaluations), so that a recipe is one file: ``tba up --profile real-model``.
A flag given on the command line wins over ``[run]``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILES = Path(__file__).with_name("profiles")
DEFAULT = "default"
SERVICES = ("all", "trainer", "searcher", "buffer")
RUN = "run"
KINDS = {str: "a string", int: "an integer", float: "a number"}
BASE = "base"  # a top-level key: the profile this one is applied over (its settings stand where this one is silent)
# tba up's flags a profile's [run] table may set, with their type and their default where no profile sets them
# (--task: the environment's TBA_TASK comes before the profile).
RUN_FLAGS: dict[str, tuple[type, Any]] = {
    "task": (str, "arithmetic"),
    "base-model": (str, None),
    "minutes": (float, 10.0),
    "eval-prompts": (int, 200),
    "eval-every": (float, 30.0),
    "searchers": (int, None),
    "backfill": (int, None),
}
CONDITIONS = {
    "shared-cores": "searchers and the trainer on the same cores",
    "separate-cores": "searchers and the trainer on cores of their own",
    "separate-cpu-cores": "on cores of their own, the trainer on the CPU as one process",
}


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class Placement:
    """What the profile's conditions are decided on."""

    separate_cores: bool
    trainer_on_cpu: bool  # the trainer on the CPU as one process (not CUDA, not torchrun ranks)

    def holds(self, condition: str) -> bool:
        return {
            "shared-cores": not self.separate_cores,
            "separate-cores": self.separate_cores,
            "separate-cpu-cores": self.separate_cores and self.trainer_on_cpu,
        }[condition]


@dataclass(frozen=True)
class Profile:
    path: Path
    tables: dict[tuple[str, str | None], dict[str, str]]  # (service, condition or None) -> settings
    run: dict[str, Any] = field(default_factory=dict)  # [run]: flag name (as RUN_FLAGS) -> value
    bases: tuple[str, ...] = ()  # the profiles this one is applied over, nearest first

    @property
    def label(self) -> str:
        """Where a setting comes from, as ``--print-config`` and run.json name it."""
        return " over ".join((self.path.name, *self.bases))

    @classmethod
    def load(cls, name: str | Path = DEFAULT, _within: tuple[Path, ...] = ()) -> Profile:
        """A packaged profile by name (a file of tba/local/profiles/, ``default``) or a TOML file by path, applied
        over its ``base`` (a name, or a path beside the file); ``_within``: the profiles that named this one."""
        path = Path(name) if str(name).endswith(".toml") or Path(name).is_file() else PROFILES / f"{name}.toml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.toml")))
            raise ProfileError(f"profile {str(name)!r}: no such file, and not a packaged profile ({known})")
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ProfileError(f"profile {path}: {err}") from None
        base = data.pop(BASE, None)
        own = cls(path, _tables(path, {k: v for k, v in data.items() if k != RUN}), _run_table(path, data.get(RUN, {})))
        if base is None:
            return own
        within = (*_within, path.resolve())
        beside = path.parent / base if isinstance(base, str) and base.endswith(".toml") else None
        if not isinstance(base, str) or (beside or PROFILES / f"{base}.toml").resolve() in within:
            raise ProfileError(
                f"profile {path}: {BASE} = {base!r} must name another profile, not itself or one based on it"
            )
        return cls.load(beside or base, within).under(own)

    def under(self, other: Profile) -> Profile:
        """``other`` applied over this profile: each of its tables' settings, and its ``[run]`` flags, win."""
        tables = {key: dict(values) for key, values in self.tables.items()}
        for key, values in other.tables.items():
            tables.setdefault(key, {}).update(values)
        return Profile(other.path, tables, {**self.run, **other.run}, (self.path.name, *self.bases))

    def settings(self, service: str, placement: Placement | None) -> dict[str, str]:
        """The profile's settings for ``service`` under ``placement``: ``[all]``, then the service's own, each
        followed by its tables whose condition holds (a later table wins; None: no condition's table)."""
        out: dict[str, str] = {}
        for table in ("all", service):
            out.update(self.tables.get((table, None), {}))
            for (name, condition), values in self.tables.items():
                if name == table and condition is not None and placement and placement.holds(condition):
                    out.update(values)
        return out


def _run_table(path: Path, body: Any) -> dict[str, Any]:
    """``[run]``: tba up's flags, each of its type (an int where a float is asked is taken)."""
    if not isinstance(body, dict):
        raise ProfileError(f"profile {path}: [run] must be a table of tba up's flags")
    out = {}
    for key, value in body.items():
        if key not in RUN_FLAGS:
            raise ProfileError(f"profile {path}: [run] {key}: not one of {', '.join(RUN_FLAGS)}")
        kind = RUN_FLAGS[key][0]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ProfileError(f"profile {path}: [run] {key}: {value!r} is not {KINDS[kind]}")
        out[key] = value
    return out


def _tables(path: Path, data: dict[str, Any]) -> dict[tuple[str, str | None], dict[str, str]]:
    from tba.settings import known_variables

    known = known_variables()
    tables: dict[tuple[str, str | None], dict[str, str]] = {}

    def take(service: str, condition: str | None, values: dict[str, Any]) -> None:
        where = f"[{service}{'.' + condition if condition else ''}]"
        out = {}
        for key, value in values.items():
            if isinstance(value, dict):
                raise ProfileError(f"profile {path}: {where}.{key}: a table inside a condition's table")
            if key not in known:
                raise ProfileError(
                    f"profile {path}: {where} {key}: not a setting of any service (docs/configuration.md)"
                )
            if not isinstance(value, str | int | float | bool):
                raise ProfileError(f"profile {path}: {where} {key}: {value!r} is not a string, number or boolean")
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        tables[(service, condition)] = out

    for service, body in data.items():
        if service not in SERVICES or not isinstance(body, dict):
            raise ProfileError(f"profile {path}: [{service}] is not one of {', '.join((*SERVICES, RUN))}")
        take(service, None, {k: v for k, v in body.items() if not isinstance(v, dict)})
        for condition, values in body.items():
            if isinstance(values, dict):
                if condition not in CONDITIONS:
                    raise ProfileError(
                        f"profile {path}: [{service}.{condition}]: no such condition ({', '.join(CONDITIONS)})"
                    )
                take(service, condition, values)
    return tables
