"""POPGym's own memory models (``popgym`` on PyPI, the test extra), the reference each of ours is held to.

``popgym.baselines.models`` are plain PyTorch. ``popgym.baselines.ray_models`` subclass RLlib's TorchModelV2 and
import two typing names from RLlib, nothing else of it; their ``forward_memory(z, state, t_starts, seq_lens)``, the
memory proper, is plain PyTorch too. So that they import without Ray, ``ray_model`` puts a stand-in for those RLlib
modules in sys.modules (a TorchModelV2 that only records its arguments) and builds the model through POPGym's own
constructor, whose config (``cfg``) it reads: POPGym's MODEL_CONFIG, with the sizes given."""

from __future__ import annotations

import importlib
import sys
import types

import gymnasium as gym
import pytest

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
