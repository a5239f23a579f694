"""POPGym's own memory models (``popgym`` on PyPI, the test extra), the reference each of ours is held to.

``popgym.baselines.models`` are plain PyTorch. ``popgym.baselines.ray_models`` subclass RLlib's TorchModelV2 and
import two typing names from RLlib, nothing else of it; their ``forward_memory(z, state, t_starts, seq_lens)``, the
memory proper, is plain PyTorch too. So that they import without Ray, ``ray_model`` puts a stand-in for those RLlib
modules in sys.modules (a TorchModelV2 that only records its arguments) and builds the model through POPGym's own
constructor, whose config (``cfg``) it reads: POPGym's MODEL_CONFIG, with the sizes given.

Also what the tests against it share: ``copy_weights`` (POPGym's weights into ours by an explicit name map, every
parameter of both sides used exactly once), ``popgym_options`` (its cfg names and values as our options),
``popgym_forward`` (its time embedding and memory, as its BaseModel.forward calls them) and ``popgym_state_after``
(its state after a first window, the carried-in state of a test's window)."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping

import gymnasium as gym
import pytest
import torch

popgym = pytest.importorskip("popgym", reason="popgym (the test extra) holds the reference models")


class _TorchModelV2:
    def __init__(self, obs_space, action_space, num_outputs, model_config, name):
        self.obs_space, self.action_space, self.model_config, self.name = obs_space, action_space, model_config, name


def _stand_in_for_rllib() -> None:
    if "ray.rllib.models.torch.torch_modelv2" in sys.modules:
        return
    names = ["ray", "ray.rllib", "ray.rllib.models", "ray.rllib.models.torch", "ray.rllib.models.torch.torch_modelv2"]
    names += ["ray.rllib.utils", "ray.rllib.utils.typing"]
    for name in names:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["ray.rllib.models.torch.torch_modelv2"].TorchModelV2 = _TorchModelV2
    typing = sys.modules["ray.rllib.utils.typing"]
    typing.ModelConfigDict, typing.TensorType = dict, object


def ray_model(module: str, cls: str, input_size: int, hidden_size: int, max_seq_len: int = 1024, **cfg):
    """POPGym's ``popgym.baselines.ray_models.<module>.<cls>`` whose memory maps [B, T, input_size] to
    [B, T, hidden_size] (its preprocessor's output is the memory's input); ``cfg`` overrides its MODEL_CONFIG."""
    _stand_in_for_rllib()
    model_cls = getattr(importlib.import_module(f"popgym.baselines.ray_models.{module}"), cls)
    obs = gym.spaces.Box(-1, 1, (input_size,))
    sizes = {"hidden_size": hidden_size, "preprocessor_input_size": input_size}
    sizes |= {"preprocessor_output_size": input_size, "postprocessor_output_size": hidden_size}
    config = {"max_seq_len": max_seq_len, "custom_model_config": {**sizes, **cfg}}
    return model_cls(obs, gym.spaces.Discrete(2), 2, config, cls)


# POPGym's parameters around every memory core: the feature map before it and the actor and critic heads after it.
AROUND_THE_MEMORY = ("feature_map.", "actor.", "critic.")


def _named(names: tuple[str, ...], name: str) -> bool:
    """Whether ``names`` (full names, or prefixes ending in a dot) name ``name``."""
    return any(name == n or (n.endswith(".") and name.startswith(n)) for n in names)


def copy_weights(
    ours: torch.nn.Module,
    theirs: torch.nn.Module,
    names: Mapping[str, str],
    outside: tuple[str, ...] = (),
    convert: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
) -> list[tuple[str, torch.nn.Parameter, torch.nn.Parameter]]:
    """Our parameter ``n`` <- POPGym's ``names[n]`` (through ``convert[n]`` where given), asserting that every
    parameter of ours is written exactly once and every one of POPGym's read exactly once, but those ``outside``
    names (full names, or prefixes ending in a dot: what lies around the memory, or what it never reads). Returns
    the (our name, our parameter, POPGym's parameter) triples, in ``names``' order."""
    mine, ref = dict(ours.named_parameters()), dict(theirs.named_parameters())
    unmapped, not_ours = sorted(set(mine) - set(names)), sorted(set(names) - set(mine))
    assert not unmapped and not not_ours, f"ours unmapped: {unmapped}, not ours: {not_ours}"
    sources = list(names.values())
    assert len(set(sources)) == len(sources), f"POPGym's parameters mapped twice: {sorted(sources)}"
    assert set(sources) <= set(ref), f"not POPGym's parameters: {sorted(set(sources) - set(ref))}"
    left = [n for n in ref if n not in set(sources) and not _named(outside, n)]
    assert not left, f"POPGym's parameters left unused: {left}"
    triples = []
    with torch.no_grad():
        for name, src in names.items():
            value = (convert or {}).get(name, lambda p: p)(ref[src])
            assert mine[name].shape == value.shape, (name, src)
            mine[name].copy_(value)
            triples.append((name, mine[name], ref[src]))
    return triples


def attention_pair(
    module: str, cls: str, ours_cls: type, sizes: tuple[int, int], popgym_cfg: dict, option_names, seed: int = 0
):
    """POPGym's FART or FWP (``ray_models.<module>.<cls>`` at ``sizes``, input and hidden, with ``popgym_cfg``) and
    ``ours_cls`` with its weights: our parameter X is its ``core.X`` but for our read-out ``unmap`` (its own) and our
    embedding's strength (its BaseModel's). Its LayerNorm's affine and its strength are moved off their initial
    values first, so that a dropped one shows; ``seed`` seeds the weights. Returns (POPGym's, ours, the
    ``copy_weights`` triples)."""
    torch.manual_seed(seed)
    ref = ray_model(module, cls, *sizes, **popgym_cfg)
    with torch.no_grad():
        ref.core.norm.weight.add_(0.3 * torch.randn(sizes[0]))
        ref.core.norm.bias.add_(0.3 * torch.randn(sizes[0]))
        if ref.cfg["scale_embedding"]:
            ref.embedding_strength.fill_(0.3)
    ours = ours_cls(*sizes, **popgym_options(popgym_cfg, option_names))

    def theirs(name: str) -> str:
        if name == "embedding.strength":
            return "embedding_strength"
        return name if name.startswith("unmap.") else f"core.{name}"

    # outside: its frozen sine table (compared on its own), and the strength it makes whether or not it embeds
    outside = AROUND_THE_MEMORY + ("embedding.weight",) + (("embedding_strength",) if ours.embedding is None else ())
    return ref, ours, copy_weights(ours, ref, {n: theirs(n) for n, _ in ours.named_parameters()}, outside)


def popgym_options(popgym_cfg: dict, names: Mapping[str, str]) -> dict:
    """Our options for POPGym's cfg: its names translated by ``names`` (its -> ours), its embedding None our
    "none"."""
    return {names[k]: "none" if k == "embedding" and v is None else v for k, v in popgym_cfg.items()}


def popgym_forward(ref, x: torch.Tensor, state: list, t_starts: torch.Tensor):
    """POPGym's BaseModel.forward from the feature map's output on, x [B, T, F]: its time embedding (where its cfg
    has one), its preprocessor and its forward_memory on the whole window; (y [B, T, hidden_size], its state)."""
    if ref.cfg["embedding"] is not None:
        x = ref.apply_embedding(x, t_starts)
    return ref.forward_memory(ref.pre(x), state, t_starts, torch.full((x.shape[0],), x.shape[1]))


def popgym_state_after(ref, zeros: list, x: torch.Tensor, t_starts: torch.Tensor) -> tuple[list, torch.Tensor]:
    """POPGym's state (its layout, batch first) after the window x [B, T, F] from ``zeros`` at steps ``t_starts``,
    without gradient, and the steps after it: a test window's carried-in state."""
    with torch.no_grad():
        _, state = popgym_forward(ref, x, zeros, t_starts)
    return state, t_starts + x.shape[1]
