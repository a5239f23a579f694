"""Registries own their entries: a memory model, an algorithm and a task are each declared in one place, and config,
agent, graph capture and analysis take their lists from there. A new memory model is its module and its conf file:
shown with a toy memory from outside the package, trained through the command line."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import TINY
from hang import HANG_S

from analysis import constants as C
from analysis import figstyle
from pomdp_ffm import algos, config, seq_models
from pomdp_ffm.envs import available_tasks

ROOT = Path(__file__).resolve().parents[1]

# The toy's module, as a user would write it outside the package: a read-out of the running mean of its inputs,
# with one option of its own (policy.toymem.scale) and a state of two tensors.
TOY_MODULE = '''
from dataclasses import dataclass

import torch
from torch import nn

from pomdp_ffm.rules import checked, within
from pomdp_ffm.seq_models import SeqModel, register


@dataclass
class ToyConfig:
    scale: float = checked(1.0, within(0, 10))


@register
class ToyMemory(SeqModel):
    name, label, color, options_config = "toymem", "Toy", "#cc79a7", ToyConfig

    def __init__(self, input_size, hidden_size, scale=1.0):
        super().__init__()
        self.input_size, self.hidden_size, self.scale = input_size, hidden_size, scale
        self.read = nn.Linear(input_size, hidden_size)

    def initial_state(self, batch_size, device=None):  # (the inputs' sum, their count)
        return torch.zeros(batch_size, self.input_size, device=device), torch.zeros(batch_size, 1, device=device)

    def forward(self, x, state=None):
        self._check_input(x)
        total, count = self.initial_state(x.shape[1], x.device) if state is None else state
        sums = total + x.cumsum(0)
        counts = count + torch.arange(1, x.shape[0] + 1, device=x.device).view(-1, 1, 1)
        return torch.relu(self.read(self.scale * sums / counts)), (sums[-1], counts[-1])

    def activation_floats(self):
        return 2 * self.input_size + 2 * self.hidden_size
'''
TOY_CONF = "# @package _global_\npolicy:\n  seq_model: toymem\n  toymem:\n    scale: 0.5\n"


def write_toy(tmp_path: Path) -> tuple[Path, Path]:
    """The toy's module and conf folder (conf/seq_model/toymem.yaml), nothing else."""
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "toymem.py").write_text(TOY_MODULE)
    (tmp_path / "conf" / "seq_model").mkdir(parents=True)
    (tmp_path / "conf" / "seq_model" / "toymem.yaml").write_text(TOY_CONF)
    return tmp_path / "plugin", tmp_path / "conf"


@pytest.fixture
def toy_registered(tmp_path, monkeypatch):
    """The toy imported (so registered) here, after pomdp_ffm.config; unregistered after the test."""
    plugin, _ = write_toy(tmp_path)
    monkeypatch.syspath_prepend(str(plugin))
    module = importlib.import_module("toymem")
    yield module.ToyMemory
    seq_models.unregister("toymem")
    sys.modules.pop("toymem", None)


def test_a_toy_memory_trains_from_its_module_and_conf_file(tmp_path):
    # A user's module, imported before `python -m pomdp_ffm.train` runs, and a --config-dir holding its conf file.
    plugin, conf = write_toy(tmp_path)
    run_dir = tmp_path / "run"
    main = "import runpy, toymem; runpy.run_module('pomdp_ffm.train', run_name='__main__', alter_sys=True)"
    cmd = [
        sys.executable,
        "-c",
        main,
        "--config-dir",
        str(conf),
        "env=Pendulum-V-v0",
        "seq_model=toymem",
        "device=cpu",
        *TINY,
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.run(
        cmd,
        check=False,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{plugin}:{ROOT}"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    progress = pd.read_csv(run_dir / "progress.csv")
    evaluations = progress[progress["z/env_steps"].notna()]
    assert evaluations["z/env_steps"].tolist() == [400, 600, 800]
    assert progress["rl_loss/q_rnn_grad_norm"].notna().any()  # the toy's parameters were trained
    assert (run_dir / "DONE").exists() and (run_dir / "checkpoints" / "last.pt").exists()
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert stored["policy"]["seq_model"] == "toymem" and stored["policy"]["toymem"] == {"scale": 0.5}


def test_config_names_a_registered_toy_among_the_allowed(toy_registered, run_cfg):
    with pytest.raises(ValueError) as err:
        run_cfg("policy.seq_model=transformer")
    assert str(err.value) == "policy.seq_model='transformer' is not one of ['lstm', 'gru', 'ffm', 'mlp', 'toymem']"
    # Its options section is part of the schema only when it was registered before pomdp_ffm.config was imported.
    with pytest.raises(
        ValueError,
        match=r"^policy.seq_model=toymem was registered after pomdp_ffm.config was "
        r"imported: .*register it first$",
    ):
        run_cfg("policy.seq_model=toymem")


def test_a_registered_toy_is_gone_after_its_test():
    assert "toymem" not in seq_models.available()
    with pytest.raises(ValueError, match=r"unknown seq model 'toymem'"):
        seq_models.get("toymem")


def test_a_name_is_registered_once(toy_registered):
    class Other(seq_models.SeqModel):
        name = "toymem"

    with pytest.raises(ValueError, match="'toymem' is already registered, by ToyMemory"):
        seq_models.register(Other)
    assert seq_models.register(toy_registered) is toy_registered  # (registering it again changes nothing)


def test_config_and_analysis_take_their_lists_from_the_registries():
    memories, algorithms = seq_models.available(), list(algos.ALGORITHMS)
    policy = {f.name: f for f in dataclasses.fields(config.PolicyConfig)}
    assert policy["seq_model"].metadata["rule"].says() == f"is not one of {memories}"
    assert policy["algo_name"].metadata["rule"].says() == f"is not one of {algorithms}"
    env = {f.name: f for f in dataclasses.fields(config.EnvConfig)}
    assert env["env_name"].metadata["rule"].says() == f"is not one of {available_tasks()}"
    # Each option section is the one its entry declares, under its name.
    sections = {**config.ALGORITHM_OPTIONS, **config.MEMORY_OPTIONS}
    assert sections == {
        name: cls.options_config
        for name, cls in [*((a, algos.get(a)) for a in algorithms), *((m, seq_models.get(m)) for m in memories)]
        if cls.options_config is not None
    }
    assert all(policy[name].default_factory is section for name, section in sections.items())
    # Analysis: each memory's label and colour, each algorithm's label, the figures' order.
    assert C.MEMORY_MODELS == tuple(sorted(memories))
    assert {m: C.MODEL_LABELS[m] for m in memories} == {m: seq_models.get(m).label for m in memories}
    assert {m: C.MODEL_COLORS[m] for m in memories} == {m: seq_models.get(m).color for m in memories}
    assert {a: C.ALGO_LABELS[a] for a in algorithms} == {a: algos.get(a).label for a in algorithms}
    assert set(memories) <= set(figstyle._MODEL_ORDER) and set(memories) <= set(C.KNOWN_MODELS)
    # The conf groups: one file per entry.
    for group, names in (("seq_model", memories), ("algo", algorithms), ("env", available_tasks())):
        assert sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml")) == sorted(names)


def names_outside_the_registries() -> list[tuple[str, int, str]]:
    """(module, line, name) of each string literal that is a memory's or an algorithm's name, in the package's
    modules but the registries' own (and the benchmarks, which name the variants they time)."""
    names = set(seq_models.available()) | set(algos.ALGORITHMS)
    owners = {"algos.py", "seq_models", "bench"}
    found = []
    for path in sorted((ROOT / "pomdp_ffm").rglob("*.py")):
        if owners & set(path.relative_to(ROOT / "pomdp_ffm").parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append((path.name, node.lineno, node.value))
    return found


def test_only_the_registries_know_the_names():
    # config's defaults (the paper's setting) are the only mention of a name outside its registry.
    assert [(module, name) for module, _, name in names_outside_the_registries()] == [
        ("config.py", "ffm"),
        ("config.py", "sac"),
    ]
