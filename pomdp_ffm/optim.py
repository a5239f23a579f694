"""The agent's Adam in the form the run's settings choose when the agent is built (``AdamForm``), and its state in one
form for checkpoints whatever that choice (``eager_state``), so that a run resumes under other switches."""

from __future__ import annotations

from typing import NamedTuple

import torch


class AdamForm(NamedTuple):
    """How every Adam of an agent steps. Plain (both off): the reference's. ``fused``: one kernel a step where the
    foreach form launches about 17 (train.compile, patches/020). ``capturable``: step counters on the parameters'
    device, read there, so that a CUDA graph can replay the step (train.cuda_graph on CUDA, patches/015)."""

    fused: bool = False
    capturable: bool = False

    @classmethod
    def for_update(cls, compiled: bool, cuda_graph: bool, device: torch.device | str) -> AdamForm:
        """The form an update runner with these switches steps (cuda_graph.UpdateRunner checks it): fused where
        compiled, capturable where its updates replay a CUDA graph."""
        return cls(fused=bool(compiled), capturable=bool(cuda_graph) and torch.device(device).type == "cuda")

    def adam(self, params, lr: float) -> torch.optim.Adam:
        return torch.optim.Adam(params, lr=lr, fused=self.fused or None, capturable=self.capturable)

    def loadable(self, saved: dict) -> dict:
        """A saved optimiser state in this form: torch's ``load_state_dict`` takes the switches from the state it
        loads, and moves the step counters to the parameters' device where they say fused or capturable."""
        groups = [{**g, "fused": self.fused or None, "capturable": self.capturable} for g in saved["param_groups"]]
        return {**saved, "param_groups": groups}


PLAIN = AdamForm()  # the reference's Adam


def eager_state(state_dict: dict) -> dict:
    """An optimiser's ``state_dict()`` in the plain form (capturable=False, fused=None, step counters on the CPU), as
    a plain agent saves it. Its "state" holds the live per-parameter dicts: they are replaced, never written into."""
    state = {
        k: {**st, "step": st["step"].cpu()}
        if torch.is_tensor(st.get("step")) and st["step"].device.type != "cpu"
        else st
        for k, st in state_dict["state"].items()
    }
    return {**PLAIN.loadable(state_dict), "state": state}
