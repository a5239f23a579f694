"""``python -m pomdp_ffm.bench act``: one acting step (the actor's memory and head, the action sampled and read
on the host) at the HopperBLT-V dimensions, batch 1 as in collection, for SAC with each memory, three ways:

* ``agent``: the agent's own ``act`` on its device (the reference acts on its GPU);
* ``graph`` (CUDA): ``acting_graph.ActingRunner``, the step as a CUDA-graph replay (the trainer's ``train.cuda_graph``);
* ``cpu-copy`` (CUDA): a CPU copy of the actor (``CpuActing`` below), the other way to cheap acting on a GPU
  machine; measured against the graph, not used by the trainer.

Median microseconds per step over interleaved rounds of episodes of INNER steps, carrying the memory state.

``--seeds S ...`` adds a seed axis's acting (SAC+FFM and SAC+GRU, S agents, each with its own random generators), in
microseconds per seed-step, two ways:

* ``separate``: each seed plays its episode in its own turn, as the seeds of an axis do on a CPU;
* ``gathered``: each step submitted for every seed (from its generators) before any is waited for, and each seed's
  next step submitted as soon as its action is back, as a seed axis does (``rollout.play_together``) on CUDA with
  graphs (the host launching one seed's step while the GPU runs another's).

docs/benchmarks.md has the measurements ("GPU: the update and the acting step as CUDA graphs", "Several seeds in
one process").
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ..acting_graph import ActingRunner, make_actor
from ..agent import RecurrentAgent, act_with
from ..catalog import BASELINES, CHALLENGER, COMPARED
from ..rng import SeedRNG
from ..rollout import AgentPolicy
from .common import Row, interleaved_medians
from .update import ACT, OBS, make_agent

INNER = 50
REWARD = np.full(1, 0.5, np.float32)
OBSERVS = np.random.default_rng(0).standard_normal((INNER, 1, OBS)).astype(np.float32)


class CpuActing:
    """Acting from a CPU copy of the agent's actor, refreshed from the agent by ``refresh()`` (a trainer would call
    it after each burst of updates, when the actor has moved). Its exploration noise would come from the CPU's
    generator instead of the GPU's."""

    def __init__(self, agent: RecurrentAgent):
        self.agent = agent
        self.actor = copy.deepcopy(agent.actor).to("cpu").requires_grad_(False)
        self.refresh()

    def refresh(self) -> None:
        self.actor.load_state_dict(self.agent.actor.state_dict())

    def initial_state(self, batch_size: int = 1):
        return self.actor.encoder.initial_state(batch_size, torch.device("cpu"))

    def act(self, obs, prev_action, prev_reward, state, deterministic: bool):
        return act_with(self.actor, self.agent.algo, obs, prev_action, prev_reward, state, deterministic)


def episode(actor) -> None:
    """INNER acting steps of one env, carrying the memory state and feeding each action back."""
    state, action = actor.initial_state(1), np.zeros((1, ACT), np.float32)
    for t in range(INNER):
        action, state = actor.act(OBSERVS[t], action, REWARD, state, False)


def run(repeats: int, device: torch.device) -> list[Row]:
    rows = []
    for model in COMPARED:
        agent = make_agent(model, "sac", 0, device)
        ways = {"agent": agent}
        if device.type == "cuda":
            ways["graph"] = ActingRunner(agent)
            ways["cpu-copy"] = CpuActing(agent)
        med = interleaved_medians({k: (lambda a=a: episode(a)) for k, a in ways.items()}, repeats, device)
        rows += [
            Row("acting", f"HopperBLT-V_B1_sac_{model}", k, "step_us", v / INNER * 1e6, "us") for k, v in med.items()
        ]
    return rows


def run_seeds(
    seed_counts: list[int], repeats: int, device: torch.device, models=(CHALLENGER, BASELINES[0])
) -> list[Row]:
    rows = []
    for model in models:
        for S in seed_counts:
            actors = []
            rngs = [SeedRNG() for _ in range(S)]
            for k, rng in enumerate(rngs):  # graph replays on CUDA, the agent on a CPU
                actors.append(make_actor(make_agent(model, "sac", k, device), cuda_graph=True))
                rng.keep()
            policies = [AgentPolicy(actor, deterministic=False) for actor in actors]  # what a rollout submits to

            def separate():
                for actor, rng in zip(actors, rngs):
                    with rng.active():
                        episode(actor)

            def gathered():
                states, actions, waits = [], [], []
                for policy, rng in zip(policies, rngs):
                    with rng.active(host=False):
                        states.append(policy.initial_state(1))
                        actions.append(np.zeros((1, ACT), np.float32))
                        waits.append(policy.submit(OBSERVS[0], actions[-1], REWARD, states[-1], None))
                for t in range(INNER):
                    for k, (policy, rng) in enumerate(zip(policies, rngs)):
                        with rng.active(host=False):
                            actions[k], states[k] = waits[k]()
                            if t + 1 < INNER:
                                waits[k] = policy.submit(OBSERVS[t + 1], actions[k], REWARD, states[k], None)

            med = interleaved_medians({"separate": separate, "gathered": gathered}, repeats, device)
            rows += [
                Row("acting-seeds", f"HopperBLT-V_B1_sac_{model}_S{S}", k, "seed_step_us", v / (INNER * S) * 1e6, "us")
                for k, v in med.items()
            ]
    return rows
