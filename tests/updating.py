"""One eager update of an agent, as cuda_graph.UpdateRunner runs it, for the tests that drive an agent directly:
without a runner, so that a reference update keeps the optimisers its test gave it (a compiling runner makes them
fused)."""

from pomdp_ffm.update import Aligned, update


def updated(agent, batch, grad_norms: bool = False, compiled: bool = False) -> dict:
    """``agent`` updated once on ``batch`` (its update count too): its statistics."""
    aligned = Aligned.from_batch(batch, agent.device)
    stats = update(agent, aligned, actor_step_due=agent.actor_step_due(), grad_norms=grad_norms, compiled=compiled)
    agent.count_update()
    return stats
