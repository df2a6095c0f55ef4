"""The import contract (scripts/check_layers.py, run by ``make lint``): it holds on the repository, and it
catches what it is for: an import upwards, a circle that a function-local import hides, a module no layer
claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import check_layers  # noqa: E402


def test_the_repository_keeps_the_contract() -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/check_layers.py"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout
    assert "make lint" in (ROOT / "scripts/check_layers.py").read_text()
    assert "check_layers.py" in (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]


def _tree(root: Path, modules: dict[str, str]) -> Path:
    """A tree of modules, each named as it is imported (``tba.model.__init__`` for a package)."""
    for name, text in modules.items():
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in check_layers.PACKAGES:
        (root / package).mkdir(exist_ok=True)
    return root


def test_an_upward_import_and_a_hidden_circle_are_each_caught(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tba.__init__": "",
            "tba.settings": "from tba.model.adapters import TARGETS\n",  # contracts -> models: upwards
            "tba.model.__init__": "",
            "tba.model.adapters": "TARGETS = ()\n",
            "tba.model.sft": "def f():\n    from tba.tasks.redteam import X\n",  # a circle hidden in a function
            "tba.tasks.__init__": "",
            "tba.tasks.redteam": "from tba.model import sft\nX = 1\n",
            "services.__init__": "",
            "services.trainer": "from tba.local import lifetime\n",  # a service importing the launcher
            "tba.local.__init__": "",
            "tba.local.lifetime": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tba.cli\n",
            "tba.cli": "import services.trainer\n",  # the composition root may
            "benchmarks.x": "import tba.cli\n",  # tools may
        },
    )
    assert sorted(check_layers.violations(root)) == [
        "import cycle: tba.model.sft <-> tba.tasks.redteam",
        "services.trainer (services) imports tba.local.lifetime (launcher): a layer may not import one above it",
        "tba.settings (contracts) imports tba.model.adapters (models and tasks): a layer may not import one above it",
    ]


def test_a_module_no_layer_claims_is_named(tmp_path: Path, monkeypatch) -> None:
    root = _tree(tmp_path, {"tba.__init__": "", "tba.new": ""})
    monkeypatch.setattr(check_layers, "LAYERS", {k: v for k, v in check_layers.LAYERS.items() if k != "tba"})
    assert "tba.new: no layer claims this module (scripts/check_layers.py LAYERS)" in check_layers.violations(root)
