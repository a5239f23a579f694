"""``bench act``: one batch-1 SAC acting step by the ``agent``, on CUDA also by a ``graph`` replay and a ``cpu-copy``
of the actor; ``--seeds``: S seeds acting ``separate``ly against ``gathered`` (docs/benchmarks.md, "GPU: the update
and the acting step as CUDA graphs" and "Several seeds in one process")."""
from __future__ import annotations

import copy

import numpy as np
import torch

from ..acting_graph import ActingRunner, make_actor
from ..agent import RecurrentAgent, act_with
from ..joint import SeedRNG
from ..rollout import AgentPolicy
from .common import Row, interleaved_medians
from .update import ACT, OBS, make_agent

INNER = 50
REWARD = np.full(1, 0.5, np.float32)
OBSERVS = np.random.default_rng(0).standard_normal((INNER, 1, OBS)).astype(np.float32)


class CpuActing:
    """Acting from a CPU copy of the agent's actor as of its last ``refresh()`` (a trainer would call it after each
    burst); its exploration noise comes from the CPU's generator."""

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
    for model in ("ffm", "gru", "lstm"):
        agent = make_agent(model, "sac", 0, device)
        ways = {"agent": agent, **({"graph": ActingRunner(agent), "cpu-copy": CpuActing(agent)} if device.type == "cuda"
                                   else {})}
        med = interleaved_medians({k: (lambda a=a: episode(a)) for k, a in ways.items()}, repeats, device)
        rows += [Row("acting", f"HopperBLT-V_B1_sac_{model}", k, "step_us", v / INNER * 1e6, "us")
                 for k, v in med.items()]
    return rows


def run_seeds(seed_counts: list[int], repeats: int, device: torch.device, models=("ffm", "gru")) -> list[Row]:
    rows = []
    for model in models:
        for S in seed_counts:
            actors, rngs = [], [SeedRNG() for _ in range(S)]
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
            rows += [Row("acting-seeds", f"HopperBLT-V_B1_sac_{model}_S{S}", k, "seed_step_us",
                         v / (INNER * S) * 1e6, "us") for k, v in med.items()]
    return rows

