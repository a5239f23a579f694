"""The algorithms and memory models by name, without importing torch: what ``policy.algo_name`` and
``policy.seq_model`` take, the label (and a memory's colour) analysis draws each in, its option section (a dataclass
of pomdp_ffm.options, the run's ``policy.<name>``) and where its class lives (imported only when one is built).

The package's own models are ``BUILT_IN``. Another package adds one through an entry point of the group
``pomdp_ffm.seq_models`` whose object is a ``Memory`` record, kept in a module that does not import torch::

    # pyproject.toml of the plug-in
    [project.entry-points."pomdp_ffm.seq_models"]
    toymem = "toymem:MEMORY"

    # toymem/__init__.py
    from pomdp_ffm.catalog import Memory
    @dataclass
    class ToyOptions:  # the model's keyword options besides the sizes, with their defaults
        scale: float = 1.0

    MEMORY = Memory("toymem", "Toy", "#cc79a7", "toymem.model:ToyMemory", options=ToyOptions)

It then trains from the ordinary command line, ``python -m pomdp_ffm.train seq_model=toymem``, its options under
``policy.toymem`` (docs/memory_models.md)."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import re
from dataclasses import dataclass, is_dataclass

from . import options as O

ENTRY_POINT_GROUP = "pomdp_ffm.seq_models"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # a conf group option, a config section and part of a run's folder name
_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")


@dataclass(frozen=True)
class Memory:
    name: str
    label: str
    color: str  # "#rrggbb"
    target: str  # "package.module:Class", a pomdp_ffm.seq_models.SeqModel
    options: type | None = None  # the dataclass of its keyword options besides the sizes: policy.<name>

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"memory name {self.name!r} must match {_NAME.pattern} (lower case, digits, _)")
        if not _COLOR.match(self.color):
            raise ValueError(f"memory {self.name!r}: color {self.color!r} must be '#rrggbb'")
        if self.target.count(":") != 1:
            raise ValueError(f"memory {self.name!r}: target {self.target!r} must be 'package.module:Class'")
        if self.options is not None and not is_dataclass(self.options):
            raise ValueError(f"memory {self.name!r}: options {self.options!r} must be a dataclass or None")


@dataclass(frozen=True)
class Algorithm:
    name: str
    label: str
    target: str  # "package.module:Class", in pomdp_ffm.algos
    options: type  # the dataclass of its section policy.<name>


ALGORITHMS = (
    Algorithm("sac", "SAC", "pomdp_ffm.algos:SAC", O.SACConfig),
    Algorithm("td3", "TD3", "pomdp_ffm.algos:TD3", O.TD3Config),
)


# The order the registry lists them in (errors, --help, figures' legends before FFM): the FFM paper's table of
# models (POPGym's baselines), then the linear recurrences it did not compare against, then FFM. Colours: every pair,
# and each against the Markovian and Oracle baselines' grey and black, at least 20 apart in CIELAB
# (tests/test_registries.py).
_M = "pomdp_ffm.seq_models."
BUILT_IN = (
    Memory("mlp", "MLP", "#7f7f7f", _M + "rnn:MLP"),
    Memory("posmlp", "PosMLP", "#bcbd22", _M + "posmlp:PosMLP", O.PosMLPConfig),
    Memory("stack", "Stack", "#f0027f", _M + "stack:Stack", O.StackConfig),
    Memory("tcn", "TCN", "#6a3d9a", _M + "tcn:TCN", O.TCNConfig),
    Memory("fwp", "FWP", "#843c39", _M + "fwp:FWP", O.FWPConfig),
    Memory("fart", "FART", "#17becf", _M + "fart:FART", O.FARTConfig),
    Memory("s4d", "S4D", "#2ca02c", _M + "s4d:S4D", O.S4DConfig),
    Memory("lmu", "LMU", "#fdae6b", _M + "lmu:LMU", O.LMUConfig),
    Memory("indrnn", "IndRNN", "#8c6d31", _M + "indrnn:IndRNN", O.IndRNNConfig),
    Memory("elman", "Elman", "#ff9896", _M + "elman:Elman"),
    Memory("gru", "GRU", "#0072b2", _M + "rnn:GRU"),
    Memory("lstm", "LSTM", "#009e73", _M + "rnn:LSTM"),
    Memory("dnc", "DNC", "#e69f00", _M + "dnc:DNC", O.DNCConfig),
    Memory("lru", "LRU", "#e41a1c", _M + "lru:LRU", O.LRUConfig),
    Memory("mingru", "minGRU", "#8ca252", _M + "mingru:MinGRU"),
    Memory("ffm", "FFM", "#d55e00", _M + "ffm:FFM", O.FFMConfig),
)


# The FFM paper's off-policy comparison: FFM against the memories of the reference's recurrent SAC and TD3
# (POMDP-Baselines' configs/pomdp/*/rnn.yml: GRU on the BLT tasks, LSTM on Pendulum). Analysis compares these by
# default; the benchmarks time them; a test that needs a few memories of different kinds rather than all (a
# complex-state scan, torch's fused GRU, LSTM's two-part state) takes them.
CHALLENGER = "ffm"
BASELINES = ("gru", "lstm")
COMPARED = (CHALLENGER, *BASELINES)


@functools.cache
def memories() -> dict[str, Memory]:
    """Every memory by name: the built-in ones, then those of installed plug-ins."""
    found = {m.name: m for m in BUILT_IN}
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        where = f"entry point {point.name!r} = {point.value!r} (group {ENTRY_POINT_GROUP})"
        try:
            memory = point.load()
        except Exception as e:
            raise ValueError(f"{where} does not load: {type(e).__name__}: {e}") from e
        if not isinstance(memory, Memory):
            raise ValueError(f"{where} must name a pomdp_ffm.catalog.Memory record, not a {type(memory).__name__}")
        if memory.name != point.name:
            raise ValueError(f"{where} names its record {memory.name!r}: the two names must be the same")
        if memory.name in found:
            raise ValueError(f"{where}: memory {memory.name!r} is already taken by {found[memory.name].target}")
        found[memory.name] = memory
    return found


def load(target: str):
    """The object a ``package.module:Name`` target names (the module imported now)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr, None)


def built_in(name: str) -> bool:
    return any(m.name == name for m in BUILT_IN)
