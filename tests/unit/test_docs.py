"""What the documentation cites exists.

Docstrings, comments, READMEs, Dockerfiles, scripts and configuration files cite repository paths
(``tba/model/logprobs.py``) and sections of the design docs (``docs/algorithm.md §3``). Nothing else
notices when a cited file moves or a section is renumbered, so this test checks, over every file git
tracks: each cited path exists, each ``docs/<name>.md §N`` names a section numbered N in that doc
(headings ``## N. Title``), and nothing points at design notes kept outside the repository.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

DESIGN_DOCS = ("algorithm", "architecture", "operations")
TOP_DIRS = (
    "tba",
    "services",
    "tests",
    "docs",
    "experiments",
    "benchmarks",
    "reliability",
    "scripts",
    "k8s",
    "monitoring",
    "requirements",
)
TOP_FILES = r"README\.md|RELIABILITY\.md|Makefile|pyproject\.toml|docker-compose[\w.-]*\.yml"
# A repository path: a top-level directory and what follows it, or a top-level file. Never preceded by a word
# character, '.', '/' or '-', so that a relative '../x', an absolute '/x/tba/y' or 'site-packages/tba' is not
# taken for one. Punctuation around a citation (`)`, `,`, `;`, `:` of a line number, backticks, a following
# `§N`) is outside the character class, so only a trailing '.' (the end of a sentence) needs stripping.
PATH = re.compile(r"(?<![\w./-])(?:(?:" + "|".join(TOP_DIRS) + r")/[\w./*<>{}$-]*|" + TOP_FILES + ")", re.ASCII)
TEMPLATE_CHARS = frozenset("*<{$")  # a glob or a template (`services/*/Dockerfile`, `k8s/overlays/{overlay}`)
# Tokens shaped like paths that name something else: the container images (k8s/README.md, "Images").
NOT_PATHS = frozenset({"tba/buffer", "tba/trainer", "tba/searcher", "tba/envserver"})
# Records cited before they exist: the GPU benchmark's, written on a GPU host (experiments.report renders it once
# it is there).
NOT_YET = frozenset({"docs/results/data/gpu-trainer.json"})
CITATION = re.compile(r"(?<![\w./-])docs/([\w-]+)\.md\s+§(\d+)", re.ASCII)
HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)
# Design notes that are not part of the repository must not be cited; the names are assembled here so that
# this file does not cite them itself.
OUTSIDE = tuple(f"{name}.md" for name in ("ALGORITHM", "ARCHITECTURE", "PLATFORM", "STYLE")) + (
    "../" + "shared",
    "/work/" + "shared",
)


@cache
def tracked() -> tuple[str, ...]:
    """Every file git tracks that is on disk (a file deleted in the work tree is not read)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return tuple(p for p in out.split("\0") if p and not p.startswith("runs/") and (ROOT / p).is_file())


def scanned() -> list[str]:
    """The tracked files that cite paths: code, docs, configuration, Dockerfiles, the Makefile, scripts."""
    return [
        p
        for p in tracked()
        if p.endswith((".py", ".md", ".yml", ".yaml", ".sh", "Dockerfile")) or Path(p).name == "Makefile"
    ]


def read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8", errors="replace")


def git_ignored(path: str) -> bool:
    """A path git ignores is one the user or a run makes (``k8s/overlays/gpu/secrets.env``), never a checked-in
    one; citing it is right."""
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


def sections(name: str) -> list[int]:
    return [int(n) for n in HEADING.findall(read(f"docs/{name}.md"))]


def test_design_docs_exist_with_numbered_sections() -> None:
    for name in DESIGN_DOCS:
        assert (ROOT / "docs" / f"{name}.md").is_file(), f"docs/{name}.md is missing"
        numbers = sections(name)
        assert numbers == list(range(1, len(numbers) + 1)) and numbers, (
            f"docs/{name}.md: top-level sections must be '## 1. Title', '## 2. Title', ... in order; got {numbers}"
        )


def test_cited_paths_exist() -> None:
    missing: list[str] = []
    checked = 0
    for source in scanned():
        for match in PATH.finditer(read(source)):
            token = match.group(0).rstrip(".")
            if not token or TEMPLATE_CHARS & set(token) or token in NOT_PATHS | NOT_YET:
                continue
            checked += 1
            if not (ROOT / token).exists() and not git_ignored(token):
                missing.append(f"{source}: {token}")
    assert checked > 0, "no cited path found: the pattern is broken"
    assert not missing, "cited paths that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_section_citations_name_existing_sections() -> None:
    numbered = {name: set(sections(name)) for name in DESIGN_DOCS}
    wrong: list[str] = []
    checked = 0
    for source in scanned():
        for match in CITATION.finditer(read(source)):
            name, number = match.group(1), int(match.group(2))
            checked += 1
            if name not in numbered:
                wrong.append(f"{source}: docs/{name}.md §{number} (not a design doc: {', '.join(DESIGN_DOCS)})")
            elif number not in numbered[name]:
                wrong.append(f"{source}: docs/{name}.md §{number} (sections: {sorted(numbered[name])})")
    assert checked > 0, "no section citation found: the pattern is broken"
    assert not wrong, "citations of sections that do not exist:\n" + "\n".join(wrong)


def test_nothing_points_outside_the_repository() -> None:
    offenders: list[str] = []
    for path in tracked():
        data = (ROOT / path).read_bytes()
        offenders += [f"{path}: {needle}" for needle in OUTSIDE if needle.encode() in data]
    assert not offenders, "references to notes outside the repository:\n" + "\n".join(offenders)


def documented_task(page: Path, tmp_path: Path, monkeypatch) -> tuple[str, Any]:
    """The task of a page's first ``# module.py`` example, copied as a user copies it and made by the name
    its ``TBA_TASK=module:Class`` line gives."""
    from tba.tasks import make_task

    text = page.read_text()
    match = re.search(r"```python\n# (\w+)\.py\n(.*?)```", text, re.S)
    assert match, f"{page.name}: the task example is gone"
    module, code = match.groups()
    (tmp_path / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)
    (name,) = re.findall(r"TBA_TASK=(\w+:\w+)", text)
    return name, make_task(name)


def test_the_task_example_runs(tmp_path: Path, monkeypatch) -> None:
    """docs/tasks.md: the task of your own, copied from the page as a user copies it, loads by ``module:Class``
    and scores its own held-out answers."""
    name, task = documented_task(ROOT / "docs" / "tasks.md", tmp_path, monkeypatch)
    assert task.name == name  # what its groups are stamped with
    held_out = task.eval_prompts(4)
    assert len(held_out) == 4 and all(task.reward(p, p.answer) == 1.0 for p in held_out)
    train = {p.prompt_id for p, _ in zip(task.train_prompts(0), range(100), strict=False)}
    assert not train & {p.prompt_id for p in held_out}


def test_the_multi_turn_example_plays_episodes(tmp_path: Path, monkeypatch, tiny_model: Path) -> None:
    """docs/environments.md: the multi-turn task of your own, copied as a user copies it, plays episodes in
    the held-out evaluation with a real model (the tiny one, untrained: its guesses are noise), and its
    environment answers as the page says."""
    from tba.model.evaluation import attempts, load_model
    from tba.tasks import Step

    _, task = documented_task(ROOT / "docs" / "environments.md", tmp_path, monkeypatch)
    prompt = task.eval_prompts(10)[7]
    state = task.start(prompt)
    assert task.step(prompt, state, "3") == Step(observation=" higher;")
    assert task.step(prompt, state, "7") == Step(done=True, reward=0.5)
    model, tokenizer = load_model(tiny_model)
    texts, rewards = attempts(model, tokenizer, task, task.eval_prompts(3), samples=2, temperature=1.0, seed=0)
    assert len(texts) == len(rewards) == 6 and all(0.0 <= r <= 1.0 for r in rewards)
