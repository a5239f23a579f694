"""The training loop's shape (docs/architecture.md): plain calls from ``Trainer.train`` to the first loss, no
generator driving the loop, the loop itself on one screen."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

from pomdp_ffm import update
from pomdp_ffm.train import train_job
from pomdp_ffm.trainer import Trainer

PACKAGE = Path(__file__).resolve().parents[1] / "pomdp_ffm"
LOOP_MODULES = ("trainer", "rollout", "evaluation", "jobs/seeds")


def generator_functions(source: str) -> list[str]:
    """The functions that yield, but for context managers (``@contextlib.contextmanager``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if any("contextmanager" in ast.unparse(d) for d in node.decorator_list):
            continue
        own = [n for n in ast.walk(node) if isinstance(n, (ast.Yield, ast.YieldFrom))]
        # (a yield inside a nested function is that function's, found on its own)
        nested = [
            n
            for inner in ast.walk(node)
            if inner is not node and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for n in ast.walk(inner)
            if isinstance(n, (ast.Yield, ast.YieldFrom))
        ]
        if len(own) > len(nested):
            found.append(node.name)
    return found


def test_the_finder_finds_a_generator():
    assert generator_functions("def a():\n    yield 1\ndef b():\n    return 2\n") == ["a"]
    assert generator_functions("import contextlib\n@contextlib.contextmanager\ndef c():\n    yield\n") == []


def test_no_generator_drives_the_training_path():
    found = {m: g for m in LOOP_MODULES if (g := generator_functions((PACKAGE / f"{m}.py").read_text()))}
    assert found == {}


def test_the_loop_reads_on_one_screen():
    lines = inspect.getsource(Trainer.train).splitlines()
    assert len(lines) <= 40, len(lines)


def test_from_the_loop_to_the_first_loss_in_four_calls(composed, tmp_path, monkeypatch):
    # The call stack at the first critic loss of a real (tiny) run: Trainer.train -> ... -> critic_loss.
    stacks, critic_loss = [], update.EAGER.critic_loss

    def recorded(*a, **kw):
        if not stacks:
            frames, f = [], sys._getframe(1)
            while f is not None and f.f_code.co_name != "train":
                frames.append(f.f_code.co_name)
                f = f.f_back
            stacks.append(frames[::-1])
        return critic_loss(*a, **kw)

    monkeypatch.setattr(update, "EAGER", update.EAGER._replace(critic_loss=recorded))
    train_job(composed("train.num_iters=1"), tmp_path / "run")
    # the frames between train and critic_loss, which is one more call
    assert stacks == [["update_bursts", "update_all", "update"]], stacks


def test_the_trainer_shows_a_reader_fewer_than_15_methods():
    public = [name for name in vars(Trainer) if not name.startswith("_")]
    assert len(public) < 15, public
