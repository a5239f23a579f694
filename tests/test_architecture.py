"""The package's shape (docs/architecture.md): no import cycle between its modules, counting imports inside
functions, which hide a cycle from the interpreter but not from a reader; no module too long to read; the launch
side apart from the RL core, which uses only the parts of it a run needs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pomdp_ffm"
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in its body (``from . import x`` names module x)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a path that returns to its start."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return groups


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert "pomdp_ffm.update" in graph and "pomdp_ffm.buffer" in graph["pomdp_ffm.update"]  # the walk sees imports
    assert cycles(graph) == []


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {}
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]:
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long[str(path.relative_to(ROOT))] = n
    assert long == {}


def test_the_core_uses_only_what_a_run_needs_of_the_launch_side():
    # A trainer saves its checkpoints (rundir) in this version's format (checkpoint), is told to stop (signals) and
    # reports a file it cannot write (unwritable); a seed axis starts its seeds' attempts (start), as train.run starts
    # one. Checking a command, sweeping and exit codes are the commands' own (train.py, bench/).
    commands = ("pomdp_ffm.launch", "pomdp_ffm.train", "pomdp_ffm.bench")
    used = {
        dep
        for module, deps in import_graph().items()
        if not any(module == c or module.startswith(f"{c}.") for c in commands)  # (pomdp_ffm.trainer is core)
        for dep in deps
        if dep.startswith("pomdp_ffm.launch.")
    }
    assert used == {
        "pomdp_ffm.launch.checkpoint",
        "pomdp_ffm.launch.rundir",
        "pomdp_ffm.launch.signals",
        "pomdp_ffm.launch.unwritable",
        "pomdp_ffm.launch.start",
    }
