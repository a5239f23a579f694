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
``policy.toymem`` (docs/memory_models.md). A plug-in that cannot be used is left out with one line of warning
(``memories``); choosing it is refused naming why (``skipped``)."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import sys
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
    Memory("transformer", "Transformer", "#393b79", _M + "transformer:Transformer", O.TransformerConfig),
    Memory("gtrxl", "GTrXL", "#6b6ecf", _M + "gtrxl:GTrXL", O.GTrXLConfig),
    Memory("mamba", "Mamba", "#7b4173", _M + "mamba:Mamba", O.MambaConfig),
    Memory("s5", "S5", "#56b4e9", _M + "s5:S5", O.S5Config),
    Memory("mlstm", "mLSTM", "#ce6dbd", _M + "mlstm:MLSTM", O.MLSTMConfig),
    Memory("slstm", "sLSTM", "#b15928", _M + "slstm:SLSTM", O.SLSTMConfig),
    Memory("ffm", "FFM", "#d55e00", _M + "ffm:FFM", O.FFMConfig),
)


# The FFM paper's off-policy comparison: FFM against the memories of the reference's recurrent SAC and TD3
# (POMDP-Baselines' configs/pomdp/*/rnn.yml: GRU on the BLT tasks, LSTM on Pendulum). Analysis compares these by
# default; the benchmarks time them; a test that needs a few memories of different kinds rather than all (a
# complex-state scan, torch's fused GRU, LSTM's two-part state) takes them.
CHALLENGER = "ffm"
BASELINES = ("gru", "lstm")
COMPARED = (CHALLENGER, *BASELINES)


# What memories() found of the plug-ins, by name: why each entry point it left out was left out, and where each
# memory it took came from (functools' cache keeps its answer; a cache_clear reads the entry points afresh).
_skipped: dict[str, str] = {}
_origins: dict[str, str] = {}
# The entry points warned of, in this process or the one that started it: the processes a command starts (a sweep's
# workers, the evaluation's env workers) read the catalog again, and would each repeat the warnings.
_WARNED = "POMDP_FFM_PLUGINS_WARNED"


@functools.cache
def memories() -> dict[str, Memory]:
    """Every memory by name: the built-in ones, then those of installed plug-ins. A plug-in that cannot be used (an
    entry point that does not load or names no record, a name taken, options the config cannot hold) is left out
    with one line of warning (``skipped`` keeps it): a broken plug-in breaks only itself."""
    found = {m.name: m for m in BUILT_IN}
    _skipped.clear()
    _origins.clear()
    warned = set(os.environ.get(_WARNED, "").split())
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: (p.name, _package(p))):
        where = f"entry point {point.name!r} = {point.value!r} (package {_package(point)}, group {ENTRY_POINT_GROUP})"
        memory, why = _plugged_in(point, found)
        if why is None:
            found[memory.name] = memory
            _origins[memory.name] = where
            continue
        _skipped.setdefault(point.name, f"{where} {why}")  # (of two packages' entry points of one name: the first)
        key = f"{point.name}={point.value}".replace(" ", "")
        if key not in warned:
            print(f"warning: {where} {why}; skipped", file=sys.stderr)
            warned.add(key)
    if warned:
        os.environ[_WARNED] = " ".join(sorted(warned))
    return found


def skipped() -> dict[str, str]:
    """Why each plug-in's entry point that ``memories`` left out was left out (one line), by the entry point's name."""
    memories()
    return dict(_skipped)


def named(name: str) -> str:
    """Memory ``name`` in a message about it: with its plug-in's entry point (package included), where it has one."""
    memories()
    return f"seq model {name!r}" + (f" of {_origins[name]}" if name in _origins else "")


def _package(point: importlib.metadata.EntryPoint) -> str:
    dist = point.dist
    return "unknown" if dist is None else f"{dist.name} {dist.version}"


def _plugged_in(point: importlib.metadata.EntryPoint, found: dict[str, Memory]) -> tuple[Memory | None, str | None]:
    """The record ``point`` names, or None and why it cannot be used (the words after the entry point's name)."""
    try:
        memory = point.load()
    except Exception as e:  # (the plug-in's own import: whatever it raises)
        return None, f"does not load: {one_line(e)}"
    if not isinstance(memory, Memory):
        return None, f"must name a pomdp_ffm.catalog.Memory record, not a {type(memory).__name__}"
    if memory.name != point.name:
        return None, f"names its record {memory.name!r}: the two names must be the same"
    if built_in(memory.name):
        return (
            None,
            f"names memory {memory.name!r}, the name of the built-in {found[memory.name].target}, which stays in use",
        )
    if memory.name in found:
        return None, f"names memory {memory.name!r}, already taken by {_origins[memory.name]}"
    if any(a.name == memory.name for a in ALGORITHMS):  # (policy's sections are named after both)
        return None, f"names memory {memory.name!r}, an algorithm's name"
    if memory.options is not None:
        from omegaconf import OmegaConf  # (here: only a plug-in with options needs it)

        try:  # the config holds it as policy.<name>: a type OmegaConf refuses there would refuse every command
            OmegaConf.structured(memory.options)
        except Exception as e:
            return None, f"has options {memory.options.__qualname__} the config cannot hold: {one_line(e)}"
    return memory, None


def one_line(e: BaseException) -> str:
    """A plug-in's error in a message of one line: its type, then its lines joined (an OmegaConf error has three)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {'; '.join(lines)}" if lines else type(e).__name__


def load(target: str):
    """The object a ``package.module:Name`` target names (the module imported now)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr, None)


def built_in(name: str) -> bool:
    return any(m.name == name for m in BUILT_IN)
