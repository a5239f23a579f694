"""Registries own their entries: a memory model, an algorithm and a task are each declared in one place, and config,
agent, graph capture and analysis take their lists from there. A new memory model is its module and its conf file:
shown with a toy memory from outside the package, trained through the command line."""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY
from hang import HANG_S
from marks import parametrize_first_fast

from analysis import constants as C
from analysis import figstyle
from pomdp_ffm import algos, catalog, config, seq_models
from pomdp_ffm.envs import available_tasks
from pomdp_ffm.run.exits import EXIT_REFUSED

ROOT = Path(__file__).resolve().parents[1]

# The toy plug-in, as a user would write it in a package of their own: a read-out of the running mean of its inputs,
# with one option of its own (policy.toymem.scale) and a state of two tensors. Its catalog record sits in a module
# that does not import torch, named by an entry point in the group pomdp_ffm.seq_models.
TOY_RECORD = '''
from dataclasses import dataclass

from pomdp_ffm.catalog import Memory
from pomdp_ffm.rules import checked, within


@dataclass
class ToyConfig:
    scale: float = checked(1.0, within(0, 10))


MEMORY = Memory("toymem", "Toy", "#cc79a7", "toymem.model:ToyMemory", options=ToyConfig)
'''
TOY_MODULE = '''
import torch
from torch import nn

from pomdp_ffm.seq_models import SeqModel


class ToyMemory(SeqModel):
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


# Plug-ins broken in each way the catalog, the config or the build must name (a package may hold any of them): records
# whose name or options cannot be used, whose class's module is not there, whose forward gives the wrong shapes.
BROKEN_RECORDS = """
from dataclasses import dataclass, field

from pomdp_ffm.catalog import Memory


@dataclass
class SetOptions:
    taps: set = field(default_factory=set)  # (no type a config holds)


CLASH = Memory("ffm", "Toy", "#cc79a7", "toymem.model:ToyMemory")
ALGORITHM = Memory("sac", "Toy", "#cc79a7", "toymem.model:ToyMemory")
UNHELD = Memory("toyset", "Toy", "#cc79a7", "toymem.model:ToyMemory", options=SetOptions)
ABSENT = Memory("toyabsent", "Toy", "#cc79a7", "toymem.absent:ToyMemory")
WIDE = Memory("toywide", "Toy", "#cc79a7", "toymem.wrong:WideOutput")
WHOLE = Memory("toywhole", "Toy", "#cc79a7", "toymem.wrong:WholeState")
"""
WRONG_MODELS = """
from toymem.model import ToyMemory


class WideOutput(ToyMemory):  # y one unit wider than hidden_size
    def __init__(self, input_size, hidden_size, scale=1.0):
        super().__init__(input_size, hidden_size + 1, scale)
        self.hidden_size = hidden_size


class WholeState(ToyMemory):  # every step's state, not the last one's
    def forward(self, x, state=None):
        y, (total, count) = super().forward(x, state)
        return y, (total.expand(x.shape[0], *total.shape), count)
"""


def install_toy(site: Path, entry: str = "toymem = toymem:MEMORY") -> Path:
    """The toy package installed in ``site`` as pip would leave it: the package and its .dist-info, whose
    entry_points.txt is what importlib.metadata reads (``entry``: its lines)."""
    (site / "toymem").mkdir(parents=True)
    (site / "toymem" / "__init__.py").write_text(TOY_RECORD)
    (site / "toymem" / "model.py").write_text(TOY_MODULE)
    (site / "toymem" / "broken.py").write_text(BROKEN_RECORDS)
    (site / "toymem" / "wrong.py").write_text(WRONG_MODELS)
    info = site / "toymem-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toymem\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[pomdp_ffm.seq_models]\n{entry}\n")
    return site


@pytest.fixture
def plugged_in(tmp_path, monkeypatch):
    """Installs a toy plug-in (``install``'s argument: its entry point line) on sys.path; the catalog read afresh,
    then forgotten."""

    def install(entry: str = "toymem = toymem:MEMORY"):
        monkeypatch.syspath_prepend(str(install_toy(tmp_path / "site", entry)))
        catalog.memories.cache_clear()

    # (No plug-in warned of yet in this process tree: the catalog's record of those it warned of is undone after.)
    monkeypatch.setenv(catalog._WARNED, "")

    yield install
    catalog.memories.cache_clear()
    for name in [m for m in sys.modules if m == "toymem" or m.startswith("toymem.")]:
        del sys.modules[name]


def test_a_plugged_in_memory_trains_from_the_command_line(tmp_path):
    # A package installed beside pomdp_ffm, found through its entry point: nothing else is given.
    site = install_toy(tmp_path / "site")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "pomdp_ffm.train", "env=Pendulum-V-v0", "seq_model=toymem", "policy.toymem.scale=0.5"]
    cmd += ["device=cpu", *TINY, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    progress = pd.read_csv(run_dir / "progress.csv")
    evaluations = progress[progress["z/env_steps"].notna()]
    assert evaluations["z/env_steps"].tolist() == [400, 600, 800]
    assert progress["rl_loss/q_rnn_grad_norm"].notna().any()  # the toy's parameters were trained
    assert (run_dir / "DONE").exists() and (run_dir / "checkpoints" / "last.pt").exists()
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert stored["policy"]["seq_model"] == "toymem" and stored["policy"]["toymem"] == {"scale": 0.5}


def test_a_plug_in_is_listed_after_the_built_in_memories(plugged_in):
    plugged_in()
    assert seq_models.available() == [*(m.name for m in catalog.BUILT_IN), "toymem"]
    model = seq_models.build("toymem", input_size=3, hidden_size=4, scale=2.0)
    assert type(model).__name__ == "ToyMemory" and model.scale == 2.0
    assert catalog.memories()["toymem"].label == "Toy"


WHERE = r"entry point '{}' = '{}' \(package toymem 0\.1, group pomdp_ffm\.seq_models\)"


@pytest.mark.parametrize(
    "entry, error",
    [
        ("gru = toymem:MEMORY", r"names its record 'toymem': the two names must be the same"),
        ("toymem = toymem.model:ToyMemory", r"must name a pomdp_ffm.catalog.Memory record, not a type"),
        ("toymem = toymem:NOTHING", r"does not load: AttributeError: module 'toymem' has no attribute 'NOTHING'"),
        ("toymem = toymem.absent:MEMORY", r"does not load: ModuleNotFoundError: No module named 'toymem.absent'"),
        ("sac = toymem.broken:ALGORITHM", r"names memory 'sac', an algorithm's name"),
        (
            "toyset = toymem.broken:UNHELD",
            r"has options SetOptions the config cannot hold: ValidationError: Unexpected type annotation: set; "
            r"full_key: taps; object_type=SetOptions",
        ),
    ],
    ids=["name", "not_a_record", "no_attribute", "no_module", "algorithm_name", "options"],
)
def test_a_broken_plug_in_is_one_line_of_warning_and_skipped(plugged_in, capsys, entry, error):
    # A broken plug-in breaks only itself: the others, and every command that does not choose it, go on.
    plugged_in(entry)
    name, value = (part.strip() for part in entry.split("="))
    assert catalog.memories() == {m.name: m for m in catalog.BUILT_IN}
    why = WHERE.format(re.escape(name), re.escape(value)) + " " + error
    assert re.fullmatch(why, catalog.skipped()[name]) and list(catalog.skipped()) == [name]
    assert re.fullmatch(f"warning: {why}; skipped\n", capsys.readouterr().err)


def test_a_plug_in_cannot_take_a_built_in_name(plugged_in, capsys):
    # Refused naming both, the built-in memory kept.
    plugged_in("ffm = toymem.broken:CLASH")
    assert catalog.memories()["ffm"] == next(m for m in catalog.BUILT_IN if m.name == "ffm")
    assert seq_models.get("ffm") is seq_models.FFM
    assert catalog.skipped() == {
        "ffm": "entry point 'ffm' = 'toymem.broken:CLASH' (package toymem 0.1, group pomdp_ffm.seq_models) "
        "names memory 'ffm', the name of the built-in pomdp_ffm.seq_models.ffm:FFM, which stays in use"
    }
    assert capsys.readouterr().err.count("warning:") == 1


def test_a_plug_in_is_warned_of_once_per_process_tree(plugged_in, capsys, tmp_path):
    # The processes a command starts (a sweep's workers, the evaluation's env workers) read the catalog again.
    plugged_in("toymem = toymem.absent:MEMORY")
    catalog.memories()
    assert capsys.readouterr().err.startswith("warning: entry point 'toymem'")
    catalog.memories.cache_clear()
    assert "toymem" in catalog.skipped() and capsys.readouterr().err == ""
    code = "import pomdp_ffm.catalog as c; print(sorted(c.skipped()))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, env=env)
    assert (proc.stdout, proc.stderr) == ("['toymem']\n", "")


@pytest.mark.parametrize(
    "entry, error",
    [
        (
            "toywide = toymem.broken:WIDE",
            r"forward\(x\[3, 2, 3\], None\) must return y of shape \[3, 2, 4\] \(T, B, hidden_size\), not \[3, 2, 5\]",
        ),
        (
            "toywhole = toymem.broken:WHOLE",
            r"forward\(x\[3, 2, 3\], None\) must return a state of initial_state\(2\)'s shapes \[\[2, 3\], \[2, 1\]\], "
            r"not \[\[3, 2, 3\], \[2, 1\]\]",
        ),
        (
            "toyabsent = toymem.broken:ABSENT",
            r"its class toymem.absent:ToyMemory does not load: ModuleNotFoundError: No module named 'toymem.absent'",
        ),
    ],
    ids=["output", "state", "class_module"],
)
def test_a_plug_in_memory_of_the_wrong_shapes_is_named_as_it_is_built(plugged_in, entry, error):
    # Once, as it is built (one tiny forward), with the shapes expected, not a matmul's error at the first update.
    plugged_in(entry)
    name, value = (part.strip() for part in entry.split("="))
    with pytest.raises(
        ValueError, match=f"^seq model '{name}' of {WHERE.format(re.escape(name), re.escape(value))}: {error}$"
    ):
        seq_models.build(name, input_size=3, hidden_size=4)


def _command(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A command of the project, run with the plug-ins of ``site`` installed (none warned of before)."""
    env = {k: v for k, v in os.environ.items() if k != catalog._WARNED}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    return subprocess.run(
        [sys.executable, *args], check=False, capture_output=True, text=True, timeout=HANG_S, cwd=cwd, env=env
    )


# Every kind of broken plug-in at once, in one package: an entry point that does not import, one taking a built-in's
# name, options the config cannot hold, a class's module missing, a forward of the wrong shape.
BROKEN = (
    "toymem = toymem.absent:MEMORY",
    "ffm = toymem.broken:CLASH",
    "toyset = toymem.broken:UNHELD",
    "toyabsent = toymem.broken:ABSENT",
    "toywide = toymem.broken:WIDE",
)


@pytest.mark.slow
def test_commands_that_do_not_use_a_broken_plug_in_work(tmp_path):
    site = install_toy(tmp_path / "site", "\n".join(BROKEN))
    run_dir = tmp_path / "run"
    train = ["-m", "pomdp_ffm.train", "env=Pendulum-V-v0", "seq_model=gru", "device=cpu", *TINY]
    proc = _command(site, *train, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0 and (run_dir / "DONE").exists(), proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert [w.split("'")[1] for w in warnings] == ["ffm", "toymem", "toyset"], warnings  # (one line each)
    proc = _command(site, "-m", "analysis", "--help", cwd=tmp_path)  # (the other commands read the same catalog)
    assert proc.returncode == 0 and proc.stderr.count("warning:") == 3, proc.stderr[-2000:]


@parametrize_first_fast(
    "choice, error",
    [
        ("seq_model=toymem", r"seq_model=toymem: entry point 'toymem' = 'toymem.absent:MEMORY' .* does not load: "),
        ("policy.seq_model=toyset", r"policy.seq_model='toyset': entry point 'toyset' = .* the config cannot hold: "),
        ("seq_model=toyabsent", r"seq model 'toyabsent' of .*: its class toymem.absent:ToyMemory does not load: "),
        ("seq_model=toywide", r"seq model 'toywide' of .*: forward\(x\[3, 2, \d+\], None\) must return y of shape "),
    ],
    ids=["no_module", "options", "class_module", "output"],
)
def test_choosing_a_broken_plug_in_is_one_line_and_exit_2(tmp_path, choice, error):
    # Named with its package, entry point and cause; nothing left behind, the run directory included.
    site = install_toy(tmp_path / "site", "\n".join(BROKEN))
    run_dir = tmp_path / "run"
    train = ["-m", "pomdp_ffm.train", "env=Pendulum-V-v0", choice, "device=cpu", *TINY]
    proc = _command(site, *train, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("warning:")]
    assert proc.returncode == EXIT_REFUSED and len(errors) == 1, proc.stderr[-2000:]
    assert re.match(f"error: {error}", errors[0]) and "(package toymem 0.1, group pomdp_ffm.seq_models)" in errors[0]
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "fields, error",
    [
        (("Toy", "Toy", "#cc79a7", "a:B"), r"memory name 'Toy' must match"),
        (("toy", "Toy", "red", "a:B"), r"memory 'toy': color 'red' must be '#rrggbb'"),
        (("toy", "Toy", "#cc79a7", "a.B"), r"memory 'toy': target 'a.B' must be 'package.module:Class'"),
    ],
)
def test_a_catalog_record_checks_its_fields(fields, error):
    with pytest.raises(ValueError, match=error):
        catalog.Memory(*fields)


def _cielab(color: str) -> np.ndarray:
    """sRGB "#rrggbb" to CIELAB (D65), the space in which a distance of about 2 is just noticeable."""
    rgb = np.array([int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    r = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(r > (6 / 29) ** 3, np.cbrt(r), r / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_every_memory_keeps_a_colour_of_its_own():
    # Every registered memory, and the Markovian and Oracle baselines' grey and black, pairwise at least 20 apart in
    # CIELAB (a difference a reader sees at a glance in a legend).
    colors = {name: m.color for name, m in catalog.memories().items()}
    colors |= {name: C.MODEL_COLORS[name] for name in ("markovian", "oracle")}
    assert len(set(colors.values())) == len(colors)
    names = list(colors)
    gaps = {
        (a, b): float(np.linalg.norm(_cielab(colors[a]) - _cielab(colors[b])))
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    }
    assert min(gaps.values()) >= 20, sorted(gaps.items(), key=lambda kv: kv[1])[:3]
    assert _cielab("#ffffff")[0] == pytest.approx(100, abs=0.01) and _cielab("#000000")[0] == pytest.approx(0)


def test_the_catalog_does_not_import_torch():
    code = "import sys, pomdp_ffm.catalog as c; c.memories(); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT)
    assert proc.stdout.strip() == "False", proc.stderr


def test_config_and_analysis_take_their_lists_from_the_registries():
    memories, algorithms = seq_models.available(), list(algos.ALGORITHMS)
    policy = {f.name: f for f in dataclasses.fields(config.PolicyConfig)}
    assert policy["seq_model"].metadata["rule"].says() == f"is not one of {memories}"
    assert policy["algo_name"].metadata["rule"].says() == f"is not one of {algorithms}"
    env = {f.name: f for f in dataclasses.fields(config.EnvConfig)}
    assert env["env_name"].metadata["rule"].says() == f"is not one of {available_tasks()}"
    # Each option section is the one its catalog record declares, under its name, and holds the constructor's
    # keyword options besides the sizes (a model stacking layers takes policy.rnn_num_layers instead).
    sections = {**config.ALGORITHM_OPTIONS, **config.MEMORY_OPTIONS}
    records = [*catalog.ALGORITHMS, *catalog.memories().values()]
    assert sections == {r.name: r.options for r in records if r.options is not None}
    assert all(policy[name].default_factory is section for name, section in sections.items())
    for name in memories:
        fields = [f.name for f in dataclasses.fields(sections[name])] if name in sections else []
        assert seq_models.keywords(name) in (fields, ["num_layers"]), name
    # Analysis: each memory's label and colour, each algorithm's label, the figures' order.
    assert C.MEMORY_MODELS == tuple(memories)
    assert {m: C.MODEL_LABELS[m] for m in memories} == {m: catalog.memories()[m].label for m in memories}
    assert {m: C.MODEL_COLORS[m] for m in memories} == {m: catalog.memories()[m].color for m in memories}
    assert {a: C.ALGO_LABELS[a] for a in algorithms} == {a.name: a.label for a in catalog.ALGORITHMS}
    assert [algos.get(a).__name__ for a in algorithms] == ["SAC", "TD3"]
    assert set(memories) <= set(figstyle._MODEL_ORDER) and set(memories) <= set(C.KNOWN_MODELS)
    # The conf groups: one file per entry.
    for group, names in (("seq_model", memories), ("algo", algorithms), ("env", available_tasks())):
        assert sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml")) == sorted(names)
    # A memory's conf file names the memory, nothing else: its options' defaults are its dataclass's alone.
    for name in memories:
        assert yaml.safe_load((ROOT / "conf" / "seq_model" / f"{name}.yaml").read_text()) == {
            "policy": {"seq_model": name}
        }, name


ONE_PLACE = """
import dataclasses, sys, typing
from pomdp_ffm import options
# DNC's cell_size default changed where it is written, before anything reads it
hints = typing.get_type_hints(options.DNCConfig)
fields = [(f.name, hints[f.name], dataclasses.field(default=8 if f.name == "cell_size" else f.default,
           metadata=f.metadata)) for f in dataclasses.fields(options.DNCConfig)]
options.DNCConfig = dataclasses.make_dataclass(
    "DNCConfig", fields, namespace={"check_chosen": options.DNCConfig.check_chosen})
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from pomdp_ffm.agent import RecurrentAgent
from pomdp_ffm.config import register_configs
from pomdp_ffm.seq_models import build, get
register_configs()
with initialize_config_dir(sys.argv[1], version_base="1.3"):
    cfg = OmegaConf.to_object(compose("config", overrides=["seq_model=dnc", "policy.rnn_hidden_size=32"]))
agent = RecurrentAgent(3, 1, cfg.policy)
print(cfg.policy.dnc.cell_size, build("dnc", input_size=4, hidden_size=32).cell_size, get("dnc")(4, 32).cell_size,
      agent.critic.encoder.memory.cell_size, get("dnc")(4, 32, cell_size=4).cell_size)
"""


def test_a_memorys_default_changed_in_its_options_dataclass_holds_everywhere():
    # The one place of a memory's option defaults: changed there (DNC's cell_size, 16 -> 8), the composed config,
    # a model built by name or by hand, and the agent's memories all have it; a value given still wins.
    out = subprocess.run(
        [sys.executable, "-c", ONE_PLACE, str(ROOT / "conf")], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["8", "8", "8", "8", "4"]


def names_outside_the_registries() -> list[tuple[str, int, str]]:
    """(module, line, name) of each string literal that is a memory's or an algorithm's name, in the package's
    modules but the registries' own (and the benchmarks, which name the variants they time)."""
    names = set(seq_models.available()) | set(algos.ALGORITHMS)
    owners = {"algos.py", "catalog.py", "seq_models", "bench"}
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


def model_lists(source: str) -> list[tuple[int, str]]:
    """(line, source) of each literal list of memory names that ``source`` iterates over: a parametrize's values or
    a loop's or comprehension's iterable."""
    names = set(seq_models.available())

    def is_model_list(node) -> bool:
        if not isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return False
        return sum(isinstance(e, ast.Constant) and e.value in names for e in node.elts) >= 2

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.For, ast.comprehension)):
            iterables = [node.iter]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "parametrize":
            iterables = node.args[1:2]
        else:
            continue
        found += [(it.lineno, ast.unparse(it)) for it in iterables if is_model_list(it)]
    return found


def test_tests_take_their_model_lists_from_the_registry():
    # Every memory (seq_models.available()), the paper's comparison (catalog.COMPARED) or a property the classes
    # declare, never a list written out: a model added to the registry needs no test edited. tests/analysis/ is
    # not read: it labels made-up runs with the names, and builds no model.
    found = {path.name: model_lists(path.read_text()) for path in sorted((ROOT / "tests").glob("*.py"))}
    assert {name: lists for name, lists in found.items() if lists} == {}
    # What it catches:
    written_out = (
        "@pytest.mark.parametrize('model', ['ffm', 'gru'])\ndef t(model): ...\n"
        "for m in ('lstm', 'gru'): ...\n"
        "[m for m in {'ffm', 's4d', 'x'}]\n"
        "for case in [('sac', 'ffm'), ('td3', 'gru')]: ...\n"  # (cases, not a list of models)
    )
    assert sorted(line for line, _ in model_lists(written_out)) == [1, 3, 4]
