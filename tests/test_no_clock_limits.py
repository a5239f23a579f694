"""No test can fail because the machine is slow: the only wall-clock limit in the tests is the hang detector.

A busy 2-core machine runs the default suite several times slower than a quiet one, so any limit below
``hang.HANG_S`` (a pytest-timeout marker, a ``timeout=`` of a few minutes, a deadline of seconds for a process to
end) fails a correct test there. This scans every test file's syntax tree, and the Python it hands subprocesses as
text, for such limits."""

import ast
import re
from pathlib import Path

import pytest
from hang import HANG_S

TESTS = Path(__file__).resolve().parent
FILES = sorted(p for p in TESTS.rglob("*.py") if p != Path(__file__).resolve())  # its examples are limits
CLOCKS = {"time", "monotonic", "perf_counter"}  # time.time() + 10 is a deadline
WAITS = {"join", "wait", "communicate", "get", "result"}  # a first positional number is a limit in seconds


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _timeout_positions(trees: dict[Path, ast.AST]) -> dict[str, int]:
    """The tests' own helpers that take a ``timeout`` argument: name -> its position."""
    found = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                names = [a.arg for a in node.args.args]
                if "timeout" in names:
                    found[node.name] = names.index("timeout")
    return found


def clock_limits(source: str, helpers: dict[str, int]) -> list[str]:
    """Every wall-clock limit below HANG_S in ``source`` (and in the code it passes to subprocesses as strings)."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "timeout" and _name(node.value) == "mark":
            found.append(f"line {node.lineno}: a pytest-timeout marker")
        if isinstance(node, ast.Call):
            name = _name(node.func)
            limits = [k.value for k in node.keywords if k.arg == "timeout"]
            if name in WAITS and node.args:
                limits.append(node.args[0])
            if name in helpers and len(node.args) > helpers[name]:
                limits.append(node.args[helpers[name]])
            if name == "sleep" and node.args:
                seconds = _number(node.args[0])
                if seconds is not None and 1 <= seconds < HANG_S:  # a hold that ends by the clock, not a pause
                    found.append(f"line {node.lineno}: sleep({seconds:g}) holds for a fixed time")
            for limit in limits:
                seconds = _number(limit)
                if seconds is not None and seconds < HANG_S:
                    found.append(f"line {node.lineno}: {name}(... {seconds:g} s)")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
            clocked = any(isinstance(s, ast.Call) and _name(s.func) in CLOCKS for s in sides)
            seconds = [n for n in map(_number, sides) if n is not None]
            if clocked and seconds and seconds[0] < HANG_S:
                found.append(f"line {node.lineno}: a deadline {seconds[0]:g} s away")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "(" in node.value:
            try:
                found += [f"in the code at line {node.lineno}, {f}" for f in clock_limits(node.value, helpers)]
            except SyntaxError:
                pass  # not Python
    return found


def test_no_wall_clock_limit_below_the_hang_detector():
    trees = {path: ast.parse(path.read_text()) for path in FILES}
    helpers = _timeout_positions(trees)
    found = [f"{p.relative_to(TESTS)} {f}" for p in FILES for f in clock_limits(p.read_text(), helpers)]
    assert not found, "limits a slow machine can trip (use hang.HANG_S):\n" + "\n".join(found)


# Each kind of limit, one second short of the hang detector (the scan must find it however long it is).
@pytest.mark.parametrize(
    "code",
    [
        "@pytest.mark.timeout({s})\ndef test_x(): pass",
        "subprocess.run(cmd, timeout={s})",
        "proc.wait({s})",
        "deadline = time.time() + {s}",
        "_poll(ready, {s}, proc, out)",
        "time.sleep({s})",
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep({s})'])",
        'script = "import time\\ndeadline = time.monotonic() + {s}\\n"',
    ],
)
def test_the_scan_finds_each_kind_of_limit(code):
    code = code.format(s=HANG_S - 1)
    assert clock_limits(code, {"_poll": 1}), code


@pytest.mark.parametrize(
    "code",
    [
        "subprocess.run(cmd, timeout=HANG_S)",
        "proc.wait(timeout=HANG_S)",
        "deadline = time.time() + HANG_S",
        "time.sleep(0.2)",
        "queue.get()",
    ],
)
def test_the_scan_lets_the_hang_detector_pass(code):
    assert clock_limits(code, {"_poll": 1}) == []


def test_no_suite_wide_timeout_in_the_pytest_configuration():
    config = (TESTS.parent / "pyproject.toml").read_text()
    assert not re.search(r"^\s*timeout\s*=", config, re.M), "a suite-wide pytest-timeout limit"
