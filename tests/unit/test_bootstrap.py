"""scripts/bootstrap.sh's first step, the CPU build of PyTorch (scripts/install-torch.sh), which PyPI does not
carry: pip looks where its settings point, then at PyTorch's CPU index by itself; where neither has the wheel
the install stops at once and says which wheel and where it looked, instead of failing somewhere in a
150-package install.

No test downloads anything: PyTorch's CPU index is stood in for by a local index (``TORCH_INDEX_URL``)
holding a small wheel of the pinned name and version, and PyPI, which lacks that build, by an empty one."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH_PIN = next(
    line for line in (ROOT / "requirements/cpu.txt").read_text().splitlines() if line.startswith("torch==")
)
FALLBACK = "https://download.pytorch.org/whl/cpu"


def fake_index(root: Path, marker: str) -> Path:
    """A PEP 503 index at ``root`` holding one wheel named as the pinned torch, whose module says ``marker``."""
    version = TORCH_PIN.split("==")[1]
    name, dist = f"torch-{version}-py3-none-any.whl", f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"WHERE = {marker!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    digest = {
        p: base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode() for p, t in files.items()
    }
    record = "".join(f"{p},sha256={digest[p]},{len(t.encode())}\n" for p, t in files.items()) + f"{dist}/RECORD,,\n"
    (root / "torch").mkdir(parents=True)
    with zipfile.ZipFile(root / "torch" / name, "w") as wheel:
        for path, text in {**files, f"{dist}/RECORD": record}.items():
            wheel.writestr(path, text)
    (root / "torch" / "index.html").write_text(f'<a href="{name.replace("+", "%2B")}">{name}</a>\n')
    return root


def no_pip_settings(**extra: str) -> dict[str, str]:
    """The environment with none of pip's settings: no PIP_* variable, no pip.conf."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "TORCH_INDEX_URL"}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path


def without_torch(venv: Path, env: dict[str, str], command: list[str]) -> subprocess.CompletedProcess[str]:
    """``command`` run in the repository once ``venv`` holds no torch (an earlier test may have installed one)."""
    subprocess.run([venv / "bin/pip", "uninstall", "-q", "-y", "torch"], env=env, capture_output=True, timeout=60)
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def install_torch(venv: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return without_torch(venv, env, ["bash", "scripts/install-torch.sh", str(venv / "bin/pip")])


def installed_from(venv: Path) -> str:
    return subprocess.run(
        [venv / "bin/python", "-c", "import torch; print(torch.WHERE)"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_with_no_pip_settings_the_wheel_comes_from_pytorchs_cpu_index(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "pypi").mkdir()  # an index without the CPU build, as PyPI is
    env = no_pip_settings(
        PIP_INDEX_URL=(tmp_path / "pypi").as_uri(), TORCH_INDEX_URL=fake_index(tmp_path / "pytorch", "pytorch").as_uri()
    )
    proc = install_torch(venv, env)
    assert proc.returncode == 0, proc.stderr
    assert f"{TORCH_PIN} is not where pip's settings point; trying PyTorch's CPU index" in proc.stdout
    assert installed_from(venv) == "pytorch"


def test_where_pips_settings_point_comes_first(venv: Path, tmp_path: Path) -> None:
    wheels = fake_index(tmp_path / "wheels", "find-links") / "torch"  # a local wheel folder, as on this machine
    pytorch = fake_index(tmp_path / "pytorch", "pytorch")
    proc = install_torch(venv, no_pip_settings(PIP_FIND_LINKS=str(wheels), TORCH_INDEX_URL=pytorch.as_uri()))
    assert proc.returncode == 0, proc.stderr
    assert "trying PyTorch's CPU index" not in proc.stdout
    assert installed_from(venv) == "find-links"


def test_a_wheel_found_nowhere_is_named_with_where_pip_looked(venv: Path) -> None:
    env = no_pip_settings(VENV=str(venv), PIP_NO_INDEX="1")  # no index at all, PyTorch's neither: offline, and fails
    proc = without_torch(venv, env, ["bash", "scripts/bootstrap.sh"])
    assert proc.returncode != 0
    assert f"trying PyTorch's CPU index, {FALLBACK}" in proc.stdout  # the default fallback
    assert f"pip found no wheel for {TORCH_PIN}, the CPU build of PyTorch" in proc.stderr
    assert f"nor at {FALLBACK}" in proc.stderr and "TORCH_INDEX_URL=<index> make install" in proc.stderr
    assert not list(venv.glob(".stamp-*")), "a failed bootstrap must not mark the venv as done"
