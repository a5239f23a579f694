"""The update runner (pomdp_ffm/cuda_graph.py, patches/015-cuda-graph-update.md) on a CPU: with the switch on or off it
is the eager update bit for bit; its own logic (static inputs and their host ring, one graph per host path,
warm-up, the update count, rearming after a load, the capture error) runs with a Python stand-in for CUDA graphs.
What only a GPU can show (captured graphs, pinned copies, capturable Adam, no synchronisation) is in
tests/test_cuda.py."""

import contextlib
import copy
import functools
import io

import numpy as np
import pytest
import torch
from marks import parametrize_first_fast
from test_agent import make_agent, make_batch, tensor_batch
from updating import updated

from pomdp_ffm.acting_graph import ActingRunner
from pomdp_ffm.buffer import Batch
from pomdp_ffm.catalog import COMPARED
from pomdp_ffm.config import TD3Config, TrainConfig
from pomdp_ffm.cuda_graph import CaptureError, Staging, UpdateRunner, _copied
from pomdp_ffm.optim import AdamForm
from pomdp_ffm.seq_models import FFM, available


class PythonGraph:
    """A 'graph' whose replay runs the captured function again and writes its statistics into the static
    outputs, as a CUDA graph's replay writes into the tensors its capture returned."""

    def __init__(self, fn):
        self.fn, self.outputs = fn, None

    def replay(self):
        out = self.fn()  # one dict of statistics per agent
        if self.outputs is None:
            self.outputs = out
        else:
            assert [o.keys() for o in out] == [o.keys() for o in self.outputs]
            for static, new in zip(self.outputs, out):
                for k, v in new.items():
                    static[k].copy_(v)


class PythonGraphs:
    """The runner's backend without a GPU: capture runs nothing (as a CUDA capture executes nothing), replay
    runs Python. It checks the runner's bookkeeping, not what a CUDA capture freezes."""

    needs_capturable = False

    def __init__(self, fail: Exception | None = None):
        self.fail, self.graphs, self.branched = fail, [], []

    def side_stream(self):
        return contextlib.nullcontext()

    def acting_stream(self):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def branches(self, n):
        self.branched.append(n)
        yield [None] * n

    def capture(self, fn):
        if self.fail is not None:
            raise self.fail
        self.graphs.append(PythonGraph(fn))
        return self.graphs[-1]

    def keep_for_current_stream(self, tensors):
        list(tensors)

    def synchronize(self):
        pass


CASES = [
    ("sac", "ffm", {}),
    ("sac", "gru", {}),
    ("td3", "ffm", {}),
    ("td3", "gru", {}),
    ("td3", "ffm", {"td3": TD3Config(policy_delay=2)}),
    ("td3", "gru", {"td3": TD3Config(policy_delay=3)}),
]
IDS = [f"{a}-{m}" + (f"-d{kw['td3'].policy_delay}" if kw else "") for a, m, kw in CASES]


def grad_norms_at(i):
    return i % 3 == 0  # with a policy delay of 2 or 3, every (grad_norms, actor_step) pair occurs


def run(update, agent, n=12, seed=7, batches=None):
    """n updates through `update`; the statistics, acting outputs after each update, and the final state."""
    torch.manual_seed(seed)
    stats, actions = [], []
    probe = make_batch(5)
    for i in range(n):
        batch = make_batch(i % 3) if batches is None else batches(i)
        st = update(batch, grad_norms=grad_norms_at(i))
        stats.append({k: v.clone() for k, v in st.items()})
        state = agent.initial_state(1)
        for t in range(2):
            a, state = agent.act(probe.observs[t, 0], probe.actions[t, 0], float(probe.rewards[t, 0, 0]), state, True)
            actions.append(a)
    return stats, np.stack(actions), agent.training_state()


def assert_same(a, b):
    stats_a, actions_a, state_a = a
    stats_b, actions_b, state_b = b
    assert len(stats_a) == len(stats_b)
    for sa, sb in zip(stats_a, stats_b):
        assert sa.keys() == sb.keys()
        for k in sa:
            assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape == ()
            assert torch.equal(sa[k], sb[k]), k
    np.testing.assert_array_equal(actions_a, actions_b)
    assert state_a["num_updates"] == state_b["num_updates"]
    for k, v in state_a["modules"].items():
        assert torch.equal(v, state_b["modules"][k]), k
    assert_same_optim(state_a["optim"], state_b["optim"])


def assert_same_optim(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name]["param_groups"] == b[name]["param_groups"], name
        assert a[name]["state"].keys() == b[name]["state"].keys()
        for i, st in a[name]["state"].items():
            other = b[name]["state"][i]
            assert st.keys() == other.keys()
            for k in st:
                assert st[k].device == other[k].device and torch.equal(st[k], other[k]), (name, i, k)


# --- on a CPU the runner is update.update --------------------------------------------------------------------
@parametrize_first_fast("algo, model, kw", CASES, ids=IDS)
def test_runner_on_cpu_is_the_eager_update(algo, model, kw):
    eager = make_agent(algo, model, **kw)
    ref = run(functools.partial(updated, eager), eager)
    agent = make_agent(algo, model, **kw)
    runner = UpdateRunner(agent, cuda_graph=True)  # the switch is ignored on a CPU
    assert not runner.graphed
    assert_same(run(runner, agent), ref)


def test_the_eager_runner_is_the_update_function_counted():
    # What a graph captures (update.update on static streams, the host deciding the actor step) is the eager path.
    from pomdp_ffm.update import Aligned, update

    kw = {"td3": TD3Config(policy_delay=2)}
    a, b = make_agent("td3", "ffm", **kw), make_agent("td3", "ffm", **kw)
    runner = UpdateRunner(a, cuda_graph=False)
    for i in range(4):
        torch.manual_seed(i)
        sa = runner(make_batch(i), grad_norms=i == 1)
        torch.manual_seed(i)
        sb = update(b, Aligned.from_batch(make_batch(i), "cpu"), actor_step_due=b.actor_step_due(), grad_norms=i == 1)
        b.count_update()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        assert a.num_updates == b.num_updates == i + 1
        assert ("policy_loss" in sa) == (i % 2 == 1) and a.actor_step_due() == (i % 2 == 0)


# --- the runner's own logic, with a Python stand-in for the graphs -------------------------------------------
@parametrize_first_fast("algo, model, kw", CASES, ids=IDS)
def test_runner_logic_equals_the_eager_update(algo, model, kw):
    eager = make_agent(algo, model, **kw)
    ref = run(functools.partial(updated, eager), eager, n=14)
    agent = make_agent(algo, model, **kw)
    backend = PythonGraphs()
    runner = UpdateRunner(agent, backend=backend, warmup=3)
    assert runner.graphed
    out = run(runner, agent, n=14)
    assert_same(out, ref)
    d = agent.algo.policy_delay
    paths = {(grad_norms_at(i), (i + 1) % d == 0) for i in range(14)}
    assert runner.captured_paths == paths and runner.captures == len(paths) == len(backend.graphs)
    # each path: run eagerly once (and 3 updates in all) before its capture; then every update of it is a replay
    assert runner.eager_updates + runner.replays == 14 and runner.replays >= 14 - len(paths) - 3
    assert runner.rearms == 1
    # a replay's statistics are fresh tensors, not the graph's static outputs
    st = runner(make_batch(), grad_norms=grad_norms_at(14))
    outputs = [out for g in backend.graphs for out in g.outputs]
    assert not any(v is o for v in st.values() for out in outputs for o in out.values())


def test_statistics_of_a_replay_survive_the_next_replay():
    agent = make_agent("sac", "gru")
    runner = UpdateRunner(agent, backend=PythonGraphs(), warmup=1)
    kept = [runner(make_batch(i)) for i in range(4)]
    assert runner.replays == 3
    assert len({float(s["qf1_loss"]) for s in kept}) == 4


def test_acting_sees_the_replayed_parameters():
    # A CUDA replay writes the FFM decays without Python seeing it: the runner moves the version counters, so the
    # acting cache of gamma is recomputed after each replay.
    agent = make_agent("sac", "ffm")
    runner = UpdateRunner(agent, backend=PythonGraphs(), warmup=1)
    runner(make_batch())
    runner(make_batch())  # captured and replayed
    memory = agent.actor.encoder.memory
    agent.act(np.zeros(5, np.float32), np.zeros(2), 0.0, agent.initial_state(1), True)
    key = memory._gamma_cache[0]
    with torch.no_grad():
        before = [p._version for p in agent.parameters()]
    runner.backend.graphs[0].replay = lambda: None  # a replay Python cannot see
    runner(make_batch())
    assert all(p._version > v for p, v in zip(agent.parameters(), before))
    agent.act(np.zeros(5, np.float32), np.zeros(2), 0.0, agent.initial_state(1), True)
    assert memory._gamma_cache[0] != key


def test_capture_drops_the_gamma_caches():
    agent = make_agent("td3", "ffm")
    runner = UpdateRunner(agent, backend=PythonGraphs(), warmup=1)
    runner(make_batch())
    memories = [m for m in agent.modules() if isinstance(m, FFM)]
    agent.act(np.zeros(5, np.float32), np.zeros(2), 0.0, agent.initial_state(1), True)
    seen = []
    real = runner.backend.capture

    def capture(fn):
        seen.append([m._gamma_cache for m in memories])
        return real(fn)

    runner.backend.capture = capture
    runner(make_batch())
    assert seen == [[None] * len(memories)]


def test_a_load_rearms_the_runner():
    # A resume replaces the optimisers' state: the runner drops its graphs, warms up and captures again; the run
    # equals the eager one that loads the same state.
    src = make_agent("td3", "ffm", seed=3, td3=TD3Config(policy_delay=2))
    updated(src, make_batch(1))
    updated(src, make_batch(2))
    saved = io.BytesIO()
    torch.save(src.training_state(), saved)

    def load(agent):
        saved.seek(0)
        agent.load_training_state(torch.load(saved))

    eager = make_agent("td3", "ffm", td3=TD3Config(policy_delay=2))
    torch.manual_seed(0)
    for i in range(6):
        updated(eager, make_batch(i), grad_norms=i == 5)
    load(eager)
    ref = run(functools.partial(updated, eager), eager, n=8)

    agent = make_agent("td3", "ffm", td3=TD3Config(policy_delay=2))
    runner = UpdateRunner(agent, backend=PythonGraphs(), warmup=2)
    torch.manual_seed(0)
    for i in range(6):
        runner(make_batch(i), grad_norms=i == 5)
    assert runner.captures >= 1 and runner.rearms == 1
    load(agent)
    captures = runner.captures
    out = run(runner, agent, n=8)
    assert runner.rearms == 2 and runner.captures > captures
    assert_same(out, ref)


def test_a_failed_capture_names_the_switch():
    agent = make_agent("sac", "ffm")
    runner = UpdateRunner(
        agent,
        backend=PythonGraphs(fail=RuntimeError("operation not permitted when stream is capturing\nmore detail")),
        warmup=1,
    )
    runner(make_batch())
    with pytest.raises(CaptureError) as e:
        runner(make_batch())
    msg = str(e.value)
    assert "\n" not in msg and "train.cuda_graph=false" in msg and "operation not permitted" in msg
    assert isinstance(e.value.__cause__, RuntimeError)


# --- several agents (the seed axis) ----------------------------------------------------------------------------
SEED_CASES = [
    ("sac", "ffm", {}),
    ("td3", "gru", {"td3": TD3Config(policy_delay=2)}),
    ("sac", "lstm", {}),
    ("td3", "mlp", {}),
]


@parametrize_first_fast("algo, model, kw", SEED_CASES, ids=["sac-ffm", "td3-gru-d2", "sac-lstm", "td3-mlp"])
@parametrize_first_fast("graphed", [False, True], ids=["eager", "python-graphs"])
def test_several_agents_update_as_each_alone(algo, model, kw, graphed):
    # update_all: agent k on batch k, each exactly as its own update in turn (the same RNG draws in the same
    # order), with the switch off and through the runner's logic with a stand-in for the graphs.
    S, n = 3, 10
    ref = [make_agent(algo, model, seed=k, **kw) for k in range(S)]
    torch.manual_seed(5)
    ref_stats = [
        [updated(a, make_batch((i + k) % 4), grad_norms=grad_norms_at(i)) for k, a in enumerate(ref)] for i in range(n)
    ]
    agents = [make_agent(algo, model, seed=k, **kw) for k in range(S)]
    backend = PythonGraphs() if graphed else None
    runner = UpdateRunner(agents, cuda_graph=False, backend=backend, warmup=2)
    torch.manual_seed(5)
    stats = [
        runner.update_all([make_batch((i + k) % 4) for k in range(S)], grad_norms=grad_norms_at(i)) for i in range(n)
    ]
    for i in range(n):
        for k in range(S):
            assert stats[i][k].keys() == ref_stats[i][k].keys()
            assert all(torch.equal(stats[i][k][key], ref_stats[i][k][key]) for key in stats[i][k]), (i, k)
    for a, b in zip(agents, ref):
        assert a.num_updates == b.num_updates == n
        sa, sb = a.training_state(), b.training_state()
        assert all(torch.equal(v, sb["modules"][key]) for key, v in sa["modules"].items())
        assert_same_optim(sa["optim"], sb["optim"])
    if graphed:
        assert runner.replays > 0 and backend.branched and set(backend.branched) == {S}


def test_several_agents_bad_calls():
    agents = [make_agent("sac", "gru", seed=k) for k in range(2)]
    runner = UpdateRunner(agents, backend=PythonGraphs())
    with pytest.raises(TypeError, match="update_all"):
        runner(make_batch())
    with pytest.raises(ValueError, match="one batch per agent: got 1 for 2"):
        runner.update_all([make_batch()])
    agents[1].num_updates = 4  # no policy delay: counts may differ
    assert len(runner.update_all([make_batch(), make_batch()])) == 2
    delayed = [make_agent("td3", "gru", seed=k, td3=TD3Config(policy_delay=2)) for k in range(2)]
    delayed[1].num_updates = 1
    with pytest.raises(ValueError, match=r"agree on whether this update moves their actors.*\[False, True\]"):
        UpdateRunner(delayed, backend=PythonGraphs()).update_all([make_batch(), make_batch()])
    with pytest.raises(ValueError, match="policy delay"):
        UpdateRunner([make_agent("td3", "gru", td3=TD3Config(policy_delay=2)), make_agent("td3", "gru")])


# --- acting as replays ----------------------------------------------------------------------------------------
# Every memory's state through the runner's logic with SAC; TD3's head with FFM, and with the others in make test-all.
@pytest.mark.parametrize(
    "algo, model",
    [("sac", m) for m in available()]
    + [pytest.param("td3", m, marks=() if m == "ffm" else pytest.mark.slow) for m in available()],
)
def test_acting_runner_logic_equals_the_agents_acting(algo, model):
    # Episodes of batch 1 (stochastic) and 3 (deterministic) with updates between them, through the runner's
    # logic (eager warm-up, capture, static state handed from episode to episode) with the Python stand-in.
    agent = make_agent(algo, model)
    runner = ActingRunner(agent, warmup=2, backend=PythonGraphs())
    for replayed, eager in acting_episodes(agent, runner, steps=5):
        np.testing.assert_array_equal(replayed, eager)
    assert runner.captures == 2 and runner.eager_steps == 4 and runner.replays == 4 * 2 * 5 - 4 - 0
    # one episode at a time per key: an older state whose graph a newer episode took is refused
    probe = make_batch(5)
    old = runner.initial_state(1)
    runner.act(probe.observs[0, :1], probe.actions[0, :1], probe.rewards[0, :1, 0], old, False)
    runner.act(probe.observs[0, :1], probe.actions[0, :1], probe.rewards[0, :1, 0], runner.initial_state(1), False)
    with pytest.raises(ValueError, match="taken by a newer episode"):
        runner.act(probe.observs[1, :1], probe.actions[1, :1], probe.rewards[1, :1, 0], old, False)
    with pytest.raises(ValueError, match=r"started as \(batch size, deterministic\)=\(1, True\)"):
        s = runner.initial_state(1)
        runner.act(probe.observs[0, :1], probe.actions[0, :1], probe.rewards[0, :1, 0], s, True)
        runner.act(probe.observs[0, :1], probe.actions[0, :1], probe.rewards[0, :1, 0], s, False)


def acting_episodes(agent, runner, steps: int, episodes: int = 4):
    """Episodes of batch 1 (stochastic, as collected) and of batch 3 (deterministic, as evaluated together)
    through ``runner`` and through a copy of ``agent`` acting itself, with the same RNG, the two updated alike
    between episodes: a list of (runner's actions, copy's actions)."""
    twin = copy.deepcopy(agent)
    probe = make_batch(5)
    pairs = []
    for ep in range(episodes):
        for n, det in ((1, False), (3, True)):
            out = []
            for actor in (runner, twin):
                torch.manual_seed(ep)
                state, acts = actor.initial_state(n), []
                for t in range(steps):
                    a, state = actor.act(
                        probe.observs[t, :n], probe.actions[t, :n], probe.rewards[t, :n, 0], state, det
                    )
                    acts.append(a)
                out.append(np.stack(acts))
            pairs.append(tuple(out))
        for a in (agent, twin):
            torch.manual_seed(10 + ep)
            updated(a, make_batch(ep))
    return pairs


@pytest.mark.parametrize("model", COMPARED)
def test_acting_goes_on_when_a_parameter_is_reallocated_mid_episode(model):
    # The graphs read the parameters where they were: a re-allocated one drops them, and the episode goes on
    # eagerly from the graph's memory state (then is captured again), as the agent itself would act.
    agent = make_agent("sac", model)
    runner = ActingRunner(agent, warmup=1, backend=PythonGraphs())
    twin = copy.deepcopy(agent)
    probe = make_batch(5)
    out = []
    for actor in (runner, twin):
        state, acts = actor.initial_state(2), []
        for t in range(6):
            if t == 3:
                for p in actor.agent.actor.parameters() if actor is runner else ():
                    p.data = p.data.clone()
            a, state = actor.act(probe.observs[t, :2], probe.actions[t, :2], probe.rewards[t, :2, 0], state, True)
            acts.append(a)
        out.append(np.stack(acts))
    np.testing.assert_array_equal(out[0], out[1])
    assert runner.captures == 2


@pytest.mark.slow
@parametrize_first_fast("algo, model", [("sac", "ffm"), ("td3", "gru")])
def test_a_run_through_both_runners_logs_what_the_eager_run_logs(composed, tmp_path, monkeypatch, algo, model):
    # The trainer with its updates and its acting through the runners' logic (the Python stand-in for graphs):
    # the same progress.csv as the eager run, and through a stop and resume too.
    import pandas as pd
    from test_trainer import read, train

    from pomdp_ffm import trainer as trainer_mod
    from pomdp_ffm.metrics import TIMING as TIME_COLUMNS

    # device=cpu: the runners' logic with the stand-in; on a GPU machine tests/test_cuda.py runs the real thing
    overrides = (f"algo={algo}", f"seq_model={model}", "train.num_iters=4", "env.num_eval_tasks=2", "device=cpu")
    train(composed(*overrides), tmp_path / "eager")
    runners = []
    monkeypatch.setattr(
        trainer_mod,
        "UpdateRunner",
        lambda agent, on, **kw: runners.append(UpdateRunner(agent, backend=PythonGraphs(), warmup=2)) or runners[-1],
    )
    monkeypatch.setattr(
        trainer_mod,
        "make_actor",
        lambda agent, on: runners.append(ActingRunner(agent, backend=PythonGraphs(), warmup=2)) or runners[-1],
    )

    class Interrupt(trainer_mod.Trainer):
        def _end_burst(self):
            evaluation = super()._end_burst()
            if self.standing.env_steps >= 600:
                self.stop.request(15)
            return evaluation

    assert train(composed(*overrides), tmp_path / "graphs", Interrupt).stopped
    train(composed(*overrides, "resume=true"), tmp_path / "graphs")
    assert all(r.replays > 0 for r in runners)
    pd.testing.assert_frame_equal(
        read(tmp_path / "graphs").drop(columns=TIME_COLUMNS),
        read(tmp_path / "eager").drop(columns=TIME_COLUMNS),
        check_exact=True,
    )


# --- static inputs -------------------------------------------------------------------------------------------
def test_staging_copies_each_batch_exactly_through_the_ring():
    first = make_batch(0)
    staging = Staging(first, torch.device("cpu"), ring=2)
    assert len(staging.host) == 2 and staging.flat.dtype == torch.uint8
    assert all(s.data_ptr() % 64 == 0 for s in staging.static)
    statics = [s.data_ptr() for s in staging.static]
    for i in range(5):
        batch = make_batch(i, pad_from=i + 2)
        staging.fill(batch)
        assert [s.data_ptr() for s in staging.static] == statics  # the same tensors every time
        for s, x in zip(staging.static, batch):
            assert s.dtype == torch.from_numpy(x).dtype and tuple(s.shape) == x.shape
            assert torch.equal(s, torch.from_numpy(x))
    assert staging.next == 1  # five fills through a ring of two
    # tensors (on the host or the device) are accepted; a different layout is refused
    staging.fill(tensor_batch(make_batch(9)))
    assert torch.equal(staging.static[0], torch.from_numpy(make_batch(9).observs))
    bad = make_batch(0)._replace(observs=np.zeros((3, 6, 5), np.float32))
    with pytest.raises(ValueError, match="one fixed layout.*train.cuda_graph=false"):
        staging.fill(bad)
    with pytest.raises(ValueError, match="one fixed layout"):
        staging.fill(make_batch(0)._replace(terminals=make_batch(0).terminals.astype(np.float64)))


class FakeEvent:
    """A CUDA event's interface: recorded after a copy, complete when the copy has run."""

    def __init__(self):
        self.done, self.log = True, []

    def record(self):
        self.done = False
        self.log.append("record")

    def query(self):
        return self.done

    def synchronize(self):
        self.log.append("wait")
        self.done = True


def test_a_host_buffer_is_rewritten_only_after_its_copy():
    staging = Staging(make_batch(0), torch.device("cpu"), ring=2)
    staging.cuda, staging.events = True, [FakeEvent(), FakeEvent()]  # the CUDA bookkeeping, on a CPU
    staging.fill(make_batch(0))  # buffer 0
    staging.fill(make_batch(1))  # buffer 1
    staging.events[0].done = True  # the GPU has run buffer 0's copy, not buffer 1's
    staging.fill(make_batch(2))  # buffer 0 again: free
    assert staging.events[0].log == ["record", "record"]
    staging.fill(make_batch(3))  # buffer 1 again: its copy is still queued, so the host waits for it first
    assert staging.events[1].log == ["record", "wait", "record"]
    assert torch.equal(staging.static[0], torch.from_numpy(make_batch(3).observs))


def test_staging_keeps_mixed_dtypes():
    batch = Batch(
        *(
            (np.arange(12 * 6 * k) % 7).astype(dt).reshape(12, 6, k)
            for k, dt in (
                (5, np.float32),
                (2, np.float64),
                (1, np.float32),
                (1, np.uint8),
                (5, np.float32),
                (1, np.bool_),
            )
        ),
        np.arange(6, dtype=np.int64),
    )
    staging = Staging(batch, torch.device("cpu"))
    staging.fill(batch)
    for s, x in zip(staging.static, batch):
        np.testing.assert_array_equal(s.numpy(), x)
        assert s.dtype == torch.from_numpy(x).dtype


# --- optimisers: built in their form, checkpoints in the eager form ------------------------------------------
def test_a_capturable_agent_saves_and_loads_the_eager_state():
    agent = make_agent("sac", "ffm")
    for i in range(2):
        updated(agent, make_batch(i))
    before = copy.deepcopy(agent.training_state()["optim"])
    # (a capturable Adam steps only on an accelerator: here it is built, loaded and saved)
    capturable = make_agent("sac", "ffm", seed=1, adam=AdamForm(capturable=True))
    assert len(capturable.optimizers()) == 3  # actor, critic, SAC's temperature
    assert all(g["capturable"] for o in capturable.optimizers().values() for g in o.param_groups)
    capturable.load_training_state(copy.deepcopy(agent.training_state()))
    assert all(g["capturable"] for o in capturable.optimizers().values() for g in o.param_groups)  # kept
    after = capturable.training_state()["optim"]
    assert_same_optim(after, before)  # capturable=False, step counters on the CPU, as saved by the eager agent
    assert all(g["capturable"] for o in capturable.optimizers().values() for g in o.param_groups)  # live: untouched
    # a deep copy (the tests' habit) loads it as well; a plain agent loads it plain
    twin = copy.deepcopy(capturable)
    twin.load_training_state({**twin.training_state(), "optim": after})
    assert all(g["capturable"] for o in twin.optimizers().values() for g in o.param_groups)
    agent.load_training_state({**agent.training_state(), "optim": after})
    assert not any(g["capturable"] for o in agent.optimizers().values() for g in o.param_groups)


def test_a_runner_refuses_agents_whose_adam_is_not_in_its_form():
    # train.compile's update steps fused Adam, a CUDA graph's a capturable one: the agent is built in that form
    # (trainer.Trainer), and a runner that would need another refuses it rather than change it.
    with pytest.raises(ValueError, match=r"^train.compile needs every agent's Adam built fused "):
        UpdateRunner(make_agent("sac", "ffm"), cuda_graph=False, compile=True)

    class NeedsCapturable(PythonGraphs):
        needs_capturable = True

    with pytest.raises(ValueError, match=r"^train.cuda_graph needs every agent's Adam built capturable "):
        UpdateRunner(make_agent("sac", "ffm"), backend=NeedsCapturable())
    assert UpdateRunner(make_agent("sac", "ffm", adam=AdamForm(capturable=True)), backend=NeedsCapturable()).graphed


def test_a_fused_agent_keeps_its_form_across_a_load(monkeypatch):
    # train.compile's Adam: the fused kernel (two operators a step; patches/020). The losses stay eager here
    # (compiling is tests/test_compile.py's); what is checked is the optimisers' form, their checkpoint, and a
    # resume that continues the uninterrupted run bit for bit, which it would not if the load left them unfused.
    from torch.profiler import profile

    from pomdp_ffm import update as update_mod

    monkeypatch.setattr(update_mod, "compiled_losses", lambda: update_mod.EAGER)
    agent = make_agent("sac", "ffm", adam=AdamForm(fused=True))
    eager_form = copy.deepcopy(make_agent("sac", "ffm")).training_state()["optim"]
    runner = UpdateRunner(agent, cuda_graph=False, compile=True)
    assert all(g["fused"] for o in agent.optimizers().values() for g in o.param_groups)
    torch.manual_seed(5)
    with profile() as prof:
        runner(make_batch(0))
    ops = [e.name for e in prof.events()]
    assert ops.count("aten::_fused_adam_") == 3 and "aten::_foreach_addcdiv_" not in ops  # actor, critic, alpha
    for i in range(1, 3):
        runner(make_batch(i))
    saved = copy.deepcopy(agent.training_state())
    assert all(g["fused"] is None and not g["capturable"] for o in saved["optim"].values() for g in o["param_groups"])
    assert [g.keys() for o in saved["optim"].values() for g in o["param_groups"]] == [
        g.keys() for o in eager_form.values() for g in o["param_groups"]
    ]
    torch.manual_seed(5)
    for i in range(3, 5):
        runner(make_batch(i))
    resumed = make_agent("sac", "ffm", seed=1, adam=AdamForm(fused=True))
    resumed_runner = UpdateRunner(resumed, cuda_graph=False, compile=True)
    resumed.load_training_state(saved)  # as the trainer does: the runner first, then the checkpoint
    assert all(g["fused"] for o in resumed.optimizers().values() for g in o.param_groups)
    torch.manual_seed(5)
    for i in range(3, 5):
        resumed_runner(make_batch(i))
    for k, v in agent.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k
    # Adam's formula in one kernel: a few float32 ulps from the default step's parameters (6e-8 measured, patches/020)
    eager = make_agent("sac", "ffm")
    eager_runner = UpdateRunner(eager, cuda_graph=False)
    for i in range(5):
        if i in (0, 3):  # where the compiled run was seeded
            torch.manual_seed(5)
        eager_runner(make_batch(i))
    for k, v in eager.state_dict().items():
        torch.testing.assert_close(agent.state_dict()[k], v, rtol=0, atol=2e-7, msg=k)


# --- the switch ----------------------------------------------------------------------------------------------
def test_the_switch_is_validated(run_cfg):
    # On by default since the CUDA tests ran on a GPU (patches/015).
    assert TrainConfig.__dataclass_fields__["cuda_graph"].default is True
    assert run_cfg("train.cuda_graph=false").train.cuda_graph is False
    assert run_cfg().train.cuda_graph is True


def test_the_trainer_runs_its_updates_through_the_runner(composed, tmp_path):
    from test_trainer import read, train

    from pomdp_ffm.metrics import TIMING as TIME_COLUMNS
    from pomdp_ffm.trainer import Trainer

    overrides = ("algo=td3", "seq_model=ffm", "policy.td3.policy_delay=2", "train.num_iters=4", "device=cpu")
    train(composed(*overrides), tmp_path / "eager")

    runners = []

    class WithPythonGraphs(Trainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            assert isinstance(self.updater, UpdateRunner) and not self.updater.graphed
            self.updater = UpdateRunner(self.agent, backend=PythonGraphs(), warmup=2)
            runners.append(self.updater)

    train(composed(*overrides), tmp_path / "graphs", WithPythonGraphs)
    assert runners[0].replays > 0 and len(runners[0].captured_paths) >= 3
    a, b = read(tmp_path / "eager"), read(tmp_path / "graphs")
    assert a.drop(columns=TIME_COLUMNS).equals(b.drop(columns=TIME_COLUMNS))


@pytest.mark.parametrize("mixed", [False, True], ids=["scalars", "mixed"])
def test_a_replays_statistics_are_copied_out_of_the_graphs_memory(mixed):
    # What a replay returns must outlive the next replay, which overwrites the graph's outputs: scalars of one
    # dtype are copied with one operator for all statistics of all seeds, anything else one at a time.
    from pomdp_ffm.bench.common import DispatchedOps

    outputs = [{"a": torch.tensor(1.0), "b": torch.tensor(2.0)}, {"a": torch.tensor(3.0), "b": torch.tensor(4.0)}]
    if mixed:
        outputs[1]["c"] = torch.ones(2)
    with DispatchedOps() as counted:
        got = _copied(outputs)
    assert counted.total == (5 if mixed else 1)
    for out in outputs:
        for v in out.values():
            v.add_(10)  # the next replay
    assert [{k: v.tolist() for k, v in g.items()} for g in got] == [
        {"a": 1.0, "b": 2.0},
        {"a": 3.0, "b": 4.0, **({"c": [1.0, 1.0]} if mixed else {})},
    ]
