"""The import contract: dependencies point one way, and no module imports itself in a circle.

Layers, lowest first; a module may import its own layer and those below, never above:

1. **contracts** (``tba`` minus the two packages below): schemas, codec, keys, settings, checkpoints,
   health, logs, the Redis client, the trackers, the process helpers: what every service speaks.
2. **models and tasks** (``tba.model``, ``tba.tasks``): loading, generating, log-probs, evaluating;
   prompts and rewards.
3. **services** (``services``): buffer, searcher, trainer.
4. **launcher** (``tba.local``): ``tba up``, its supervisor and lifetime guard, console, report,
   ``tba eval``. It starts services as processes, by command line, so it imports none of them.
5. **composition root** (``tba.cli``): the ``tba`` command, the one module of ``tba`` that names the
   services.
6. **tools** (``benchmarks``, ``experiments``, ``reliability``): on top of everything.

Every import counts, those inside functions too (a circle that only a function-local import hides is
still a circle), except those under ``if TYPE_CHECKING:``, which never run. A module that no layer
claims is an error: a new package gets a place here.

``python scripts/check_layers.py`` (``make lint``) prints each violation and exits 1 if there is any.

Written here rather than as import-linter contracts, which cannot say three parts of it: a layer that is a
package minus some of its subpackages (``tba`` minus the four above) without listing every module of it; a
module that no layer claims, across several top-level packages (its ``exhaustive`` check works within one
container); and no cycle between modules (its ``acyclic_siblings`` contract forbids cycles between sibling
packages, so it rejects ``tba.model`` and ``tba.tasks`` importing each other's modules, which this contract
allows, and it misses a module cycle across packages once that level is skipped).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tba", "services", "benchmarks", "experiments", "reliability")
# Module prefix -> layer (the longest prefix that matches decides).
LAYERS: dict[str, int] = {
    "tba": 1,
    "tba.model": 2,
    "tba.tasks": 2,
    "services": 3,
    "tba.local": 4,
    "tba.cli": 5,
    "benchmarks": 6,
    "experiments": 6,
    "reliability": 6,
}
NAMES = {1: "contracts", 2: "models and tasks", 3: "services", 4: "launcher", 5: "composition root", 6: "tools"}


def layer_of(module: str) -> int | None:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    return None if best is None else LAYERS[best]


def modules(root: Path) -> dict[str, Path]:
    """Every module of the checked packages under ``root``: dotted name -> file."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _import_nodes(ast.Module([child], [])))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _import_nodes(node)


def imports(module: str, path: Path, known: Iterable[str]) -> set[str]:
    """The project modules ``module`` imports (``from a import b`` counts as ``a.b`` when that is a module)."""
    known = set(known)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            while target and target not in known:  # `import tba.model.sft` from outside names a module
                target = target.rpartition(".")[0]
            if target and target != module:
                out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def violations(root: Path = ROOT) -> list[str]:
    """Every breach of the contract under ``root``, one line each (empty: the contract holds)."""
    found = modules(root)
    graph = {m: imports(m, p, found) for m, p in found.items()}
    problems = [f"{m}: no layer claims this module (scripts/check_layers.py LAYERS)" for m in found if not layer_of(m)]
    for module, targets in sorted(graph.items()):
        mine = layer_of(module)
        for target in sorted(targets):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                problems.append(
                    f"{module} ({NAMES[mine]}) imports {target} ({NAMES[theirs]}): a layer may not import one above it"
                )
    problems += [f"import cycle: {' <-> '.join(component)}" for component in cycles(graph)]
    return problems


def main() -> int:
    problems = violations()
    for line in problems:
        print(line)
    print(f"check_layers: {'FAIL' if problems else 'ok'} ({len(problems)} violations)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
