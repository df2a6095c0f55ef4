"""The ``tba`` program: help that needs no ML library, and bad arguments explained, not crashed on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tba.cli import COMMANDS, build_parser
from tba.local.commands import tba_command

HEAVY = ("torch", "transformers", "vllm")
HELP_COMMANDS = [[], *[[c] for c in COMMANDS], ["model", "init"], ["model", "sft"]]

# Runs every --help in one fresh interpreter and reports, per command, its exit code, the
# length of its help text and which heavy libraries had been imported by then.
PROBE = """
import contextlib, io, json, sys
from tba.cli import main
out = []
heavy = json.loads(sys.argv[2])
for argv in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            code = main(argv + ["--help"])
        except SystemExit as e:
            code = e.code
    out.append({"argv": argv, "code": code, "help": buf.getvalue(),
                "heavy": [m for m in heavy if m in sys.modules]})
print(json.dumps(out))
"""


def run_tba(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(tba_command(*argv), capture_output=True, text=True, timeout=timeout)


def test_every_help_works_without_importing_ml_libraries() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HELP_COMMANDS), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert [r["argv"] for r in results] == HELP_COMMANDS
    for r in results:
        name = " ".join(["tba", *r["argv"]])
        assert r["code"] == 0, name
        assert r["heavy"] == [], f"`{name} --help` imported {r['heavy']}"
        assert "usage: " + name in r["help"]
    top = results[0]["help"]
    assert all(c in top for c in COMMANDS)


def test_sub_command_help_is_useful() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("model", "eval"):
        text = sub.choices[name].format_help()
        assert "not built yet" not in text.lower(), name
    eval_help = sub.choices["eval"].format_help()
    for flag in ("--task", "--n-prompts", "--pass-k", "--samples", "--stop", "--json"):
        assert flag in eval_help


def test_no_command_is_a_usage_error() -> None:
    proc = run_tba()
    assert proc.returncode == 2 and "required: COMMAND" in proc.stderr


@pytest.mark.parametrize(
    "argv,message",
    [
        (["eval", "{tmp}/nothing-here"], "neither a model directory"),
        (["eval", "{tmp}", "--task", "chess"], "unknown task 'chess'"),
        (["eval", "{tmp}", "--task-options", "{oops"], "--task-options is not valid JSON"),
        (["eval", "{tmp}", "--pass-k", "one"], "--pass-k must be comma-separated integers"),
        (["eval", "{tmp}", "--n-prompts", "0"], "--n-prompts >= 1"),
        (["eval", "{tmp}", "--stop", "\\n"], "--stop must be a JSON list of non-empty strings"),
        (["eval", "{tmp}", "--stop", '[""]'], "--stop must be a JSON list of non-empty strings"),
        (["model", "sft", "--task-options", "[1"], "tba model sft:"),
        (["model", "sft", "--base", "{tmp}"], "--base needs --out"),
        (["model", "sft", "--task", "chess"], "unknown task 'chess'"),
        (["model", "sft", "--out", "{tmp}"], "already exists"),
        (["model", "sft", "--lr", "-1", "--out", "{tmp}/o", "--base", "{tmp}"], "lr > 0"),
        (["model", "init", "--out", "{tmp}/m", "--hidden-size", "100"], "--hidden-size must be a multiple of 64"),
    ],
)
def test_bad_arguments_are_explained(tmp_path: Path, argv: list[str], message: str) -> None:
    proc = run_tba(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
