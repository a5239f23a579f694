from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from pomdp_ffm.config import register_configs

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
register_configs()

# Settings that make a training run take seconds: short windows, a handful of updates, one eval episode.
TINY = [
    "train.num_iters=3",
    "train.num_init_rollouts_pool=1",
    "train.batch_size=4",
    "train.sampled_seq_len=16",
    "train.num_updates_per_iter=0.02",
    "eval.log_interval=1",
    "env.num_eval_tasks=1",
    "progress=false",
    "policy.rnn_hidden_size=32",
    "policy.dqn_layers=[32,32]",
    "policy.policy_layers=[32,32]",
    "checkpoint.interval=1",
]


def compose_cfg(overrides=()):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture
def composed():
    """A factory: composed(*overrides, tiny=True) -> the composed DictConfig, as the entry point gets it."""

    def make(*overrides, tiny=True):
        return compose_cfg([*(TINY if tiny else []), *overrides])

    return make


@pytest.fixture
def run_cfg():
    """A factory: run_cfg(*overrides, tiny=True) -> a validated RunConfig."""

    def make(*overrides, tiny=True):
        return OmegaConf.to_object(compose_cfg([*(TINY if tiny else []), *overrides]))

    return make


@pytest.fixture
def one_thread():
    """One thread, as a run's default (num_threads: 1) and as the reference runs torch: the bits do not depend on how
    matmuls split their work between threads, and tensors this small only lose time split over threads, many times
    over on a machine whose cores are busy (the memory zoo's test files: ``pytestmark =
    pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _quiet_cwd(tmp_path, monkeypatch):
    # MuJoCo writes MUJOCO_LOG.TXT into the working directory; keep it out of the checkout.
    monkeypatch.chdir(tmp_path)


# The zoo's reference tests, each at several seeds and sizes (docs/memory_models.md states their bounds and the
# largest difference measured over these): the module's SEED (added to each of its generator seeds) and its sizes
# (input I or IN, hidden H, window T, batch B) for one case. The first case is each module's own and runs in
# `make test`; the others in `make test-all`.
ZOO_CASES = {
    "seed0": {},
    "seed1": {"SEED": 1},
    "seed2": {"SEED": 2},
    "narrow": {"SEED": 3, "I": 6, "H": 64, "T": 17, "B": 3},
    "long": {"SEED": 4, "I": 20, "H": 48, "T": 160, "B": 2},
}


@pytest.fixture(params=[pytest.param(v, id=k, marks=() if not v else pytest.mark.slow) for k, v in ZOO_CASES.items()])
def zoo_case(request, monkeypatch) -> str:
    """One of ZOO_CASES set on the requesting test's module for the test's length; returns the case's name."""
    for name, value in request.param.items():
        names = ("I", "IN") if name == "I" else (name,)
        found = [n for n in names if hasattr(request.module, n)]
        assert found, f"{request.module.__name__} has no {' or '.join(names)} to set"
        monkeypatch.setattr(request.module, found[0], value)
    return request.node.callspec.id
