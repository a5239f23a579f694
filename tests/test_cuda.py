"""The same claims on a GPU: FFM on CUDA computes what it computes on a CPU (outputs, gradients), the agent
updates on CUDA, and a run with device=cuda trains, checkpoints and resumes on a CPU. Skipped without CUDA;
the aggregator and step-by-step checks also run on CUDA, as device parameters in tests/test_seq_models.py."""
import copy
import math

import pandas as pd
import pytest
import torch

from pomdp_ffm.seq_models import build
from pomdp_ffm.seq_models.ffm import DECAY_MIN, reference_decay_limit

import test_agent
from test_agent import EQUIVALENCE_CASES, make_agent, make_batch, tensor_batch
from test_trainer import train

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@pytest.mark.parametrize("aggregator", ["auto", "scan"])
def test_ffm_module_on_cuda_matches_cpu(aggregator):
    torch.manual_seed(2)
    ffm = build("ffm", input_size=6, hidden_size=64, aggregator=aggregator)
    gpu = copy.deepcopy(ffm).to(CUDA)
    x, s0 = torch.randn(700, 3, 6), torch.randn(3, 32, 2, dtype=torch.complex64)
    y_gpu, s_gpu = gpu(x.to(CUDA), s0.to(CUDA))
    y_cpu, s_cpu = ffm(x, s0)
    torch.testing.assert_close(y_gpu.cpu(), y_cpu, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_gpu.cpu(), s_cpu, rtol=1e-4, atol=1e-4)


def test_ffm_gradients_on_cuda_match_cpu():
    torch.manual_seed(0)
    ffm = build("ffm", input_size=6, hidden_size=64)
    with torch.no_grad():
        ffm.alpha.copy_(torch.linspace(reference_decay_limit(), DECAY_MIN, ffm.alpha.numel()))
    gpu = copy.deepcopy(ffm).to(CUDA)
    x, s0 = torch.randn(512, 3, 6), torch.randn(3, 32, 2, dtype=torch.complex64)
    w = torch.randn(512, 3, 64)
    grads = []
    for model, dev in ((ffm, "cpu"), (gpu, CUDA)):
        y, s = model(x.to(dev), s0.to(dev))
        ((y * w.to(dev)).sum() + torch.view_as_real(s).sum()).backward()
        grads.append({k: p.grad.cpu() for k, p in model.named_parameters()})
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=2e-3, atol=2e-4, msg=f"grad of {k}")


@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", ["ffm", "gru", "lstm"])
def test_agent_on_cuda_matches_cpu_and_updates(algo, model):
    from pomdp_ffm.agent import Streams

    cpu = make_agent(algo, model)
    gpu = copy.deepcopy(cpu).to(CUDA)
    batch = make_batch()
    # The deterministic parts agree across devices: critic histories and twin Q values of the same batch.
    qs = []
    for agent in (cpu, gpu):
        s = Streams.from_batch(batch, agent.device)
        with torch.no_grad():
            qs.append([q.cpu() for q in agent.critic.q(agent.critic.history(s), s.observs, s.actions)])
    for q_gpu, q_cpu in zip(qs[1], qs[0]):
        torch.testing.assert_close(q_gpu, q_cpu, rtol=1e-3, atol=1e-4)
    before = copy.deepcopy(gpu.state_dict())
    stats = gpu.update(batch, grad_norms=True)
    assert all(v.device.type == "cuda" and torch.isfinite(v) for v in stats.values())
    after = gpu.state_dict()
    assert all(v.device.type == "cuda" for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("actor."))


@pytest.mark.parametrize("grad_norms", [False, True])
@pytest.mark.parametrize("algo", ["sac", "td3"])
@pytest.mark.parametrize("model", ["ffm", "gru", "lstm", "mlp"])
def test_update_on_cuda_never_synchronises(algo, model, grad_norms):
    # patches/014: with the batch on the GPU an update only queues work (Adam's step counters stay on the CPU and
    # are read there, which is no device synchronisation); the caller synchronises when it reads the stats.
    from pomdp_ffm.config import TD3Config

    agent = make_agent(algo, model, td3=TD3Config(policy_delay=2)).to(CUDA)
    batch = tensor_batch(make_batch(), CUDA)
    agent.update(batch)  # lazy initialisation (cuBLAS/cuDNN handles, optimiser state) may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats = [agent.update(batch, grad_norms=grad_norms) for _ in range(2)]  # TD3: with and without actor step
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for st in stats:
        assert all(v.device.type == "cuda" and v.shape == () for v in st.values())
    assert all(torch.isfinite(v) for st in stats for v in st.values())


@pytest.mark.parametrize("algo, kw", EQUIVALENCE_CASES)
def test_updates_on_cuda_equal_the_per_call_bound_path(algo, kw):
    # Bit for bit as on the CPU: the update's kernels are deterministic run to run on one GPU (no atomics).
    test_agent.test_updates_equal_the_per_call_bound_path(algo, kw, device=CUDA)


def test_cuda_run_trains_and_resumes_on_cpu(run_cfg, tmp_path):
    out = train(run_cfg("env=Pendulum-V-v0", "algo=sac", "seq_model=ffm", "device=cuda"), tmp_path / "run")
    assert out["env_steps"] == 800
    df = pd.read_csv(tmp_path / "run" / "progress.csv")
    assert df["rl_loss/qf1_loss"].dropna().map(math.isfinite).all()
    # a checkpoint written on the GPU continues on a CPU-only machine
    more = run_cfg("env=Pendulum-V-v0", "algo=sac", "seq_model=ffm", "device=cpu", "resume=true",
                   "train.num_iters=4")
    out = train(more, tmp_path / "run")
    assert out["env_steps"] == 1000
