"""The profile ``tba up`` runs with: the settings it chooses for each service over the services' own defaults.

They live in one file a user reads and can replace (``tba/local/profiles/default.toml``; ``tba up --profile
NAME|FILE``), not in code, so that ``tba trainer`` alone means what docs/configuration.md says and a run
under ``tba up`` differs from it only by what this file states. A TBA_ variable set in the environment wins
over the profile. The launcher adds only what follows from the run itself (its budget, its ports, where each
process runs: :mod:`tba.local.up`), and ``tba up --print-config`` shows all of it, each value with where it
comes from.

A profile is TOML: tables ``[all]``, ``[trainer]``, ``[searcher]``, ``[buffer]`` of ``TBA_NAME = value``, and
the same with a condition after a dot (``[searcher.shared-cores]``) applying only under it
(:data:`CONDITIONS`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROFILES = Path(__file__).with_name("profiles")
DEFAULT = "default"
SERVICES = ("all", "trainer", "searcher", "buffer")
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

    @classmethod
    def load(cls, name: str | Path = DEFAULT) -> Profile:
        """A packaged profile by name (a file of tba/local/profiles/, ``default``) or a TOML file by path."""
        path = Path(name) if str(name).endswith(".toml") or Path(name).is_file() else PROFILES / f"{name}.toml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.toml")))
            raise ProfileError(f"profile {str(name)!r}: no such file, and not a packaged profile ({known})")
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ProfileError(f"profile {path}: {err}") from None
        return cls(path, _tables(path, data))

    def settings(self, service: str, placement: Placement) -> dict[str, str]:
        """The profile's settings for ``service`` under ``placement``: ``[all]``, then the service's own, each
        followed by its tables whose condition holds (a later table wins)."""
        out: dict[str, str] = {}
        for table in ("all", service):
            out.update(self.tables.get((table, None), {}))
            for (name, condition), values in self.tables.items():
                if name == table and condition is not None and placement.holds(condition):
                    out.update(values)
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
            raise ProfileError(f"profile {path}: [{service}] is not one of {', '.join(SERVICES)}")
        take(service, None, {k: v for k, v in body.items() if not isinstance(v, dict)})
        for condition, values in body.items():
            if isinstance(values, dict):
                if condition not in CONDITIONS:
                    raise ProfileError(
                        f"profile {path}: [{service}.{condition}]: no such condition ({', '.join(CONDITIONS)})"
                    )
                take(service, condition, values)
    return tables
