"""The package's shape (docs/architecture.md): no import cycle between its modules, counting imports inside
functions, which hide a cycle from the interpreter but not from a reader; no module too long to read; the folders
in layers (run/, the core, jobs/, the commands), each importing only from its own and those below."""

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


# The layers, bottom up: what a run is made of on disk and in the process (run/: its directory and atomic writes,
# checkpoints, stop signals, exit codes); the RL core (the package's own modules, and seq_models/, whose registry
# reads the core's catalog); the launch side (jobs/: checking a command, planning and locking a run directory,
# attempts, seed axes, sweeps); the commands on top (train.py, bench/). Each imports only from its own layer and
# those below.
LAYERS = {"run": 0, "core": 1, "jobs": 2, "train": 3, "bench": 3}


def folder(module: str) -> str:
    """The folder (layer) of a module of the package: its subpackage, train.py, or "core" for the others."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def folder_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, deps in import_graph().items():
        graph.setdefault(folder(module), set()).update(folder(d) for d in deps if folder(d) != folder(module))
    return graph


def test_every_folder_imports_only_from_its_layer_and_below():
    graph = folder_graph()
    assert set(graph) == set(LAYERS), graph  # every module is in a known layer
    upward = {(a, b) for a, deps in graph.items() for b in deps if LAYERS[b] > LAYERS[a]}
    assert upward == set(), upward
    assert cycles(graph) == []
    # the walk sees what it must: the core on the run layer, the launch side on the core, the command on both
    assert {"run"} <= graph["core"] and {"core", "run"} <= graph["jobs"] and {"jobs", "core"} <= graph["train"]


def test_the_layer_finder_names_each_module_s_folder():
    assert folder("pomdp_ffm.trainer") == "core" and folder("pomdp_ffm.train") == "train"
    assert folder("pomdp_ffm.run.rundir") == "run" and folder("pomdp_ffm.jobs.seeds") == "jobs"
    assert folder("pomdp_ffm.seq_models.ffm") == "core" and folder("pomdp_ffm.bench.loop") == "bench"
    assert folder("pomdp_ffm") == "core"
