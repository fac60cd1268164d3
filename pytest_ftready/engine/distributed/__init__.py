"""Multi-GPU readiness through torchrun: ``launcher`` starts ONE ``python -m
torch.distributed.run`` job in its own session, collects every rank's output and result,
enforces the timeout and diagnoses a rank that cannot join or dies; ``rank_worker`` is what
each rank runs (join, collectives, one DDP/FSDP2 step, a sharded checkpoint and its resume).
Plain Python over torch; imports nothing of pytest and no check module."""


def applies(recipe):
    """Why the distributed checks (and the judgements of a multi-process run elsewhere, such as
    rank 0's preprocessing against ddp_timeout) do not apply to ``recipe`` (None: they do)."""
    if "distributed" not in (getattr(recipe, "declared", None) or ()):
        return ("the recipe has no [distributed] table (a single-process run); add one, e.g. "
                "[distributed] world_size = 2, to check a multi-GPU run")
    d = recipe.distributed
    if d.world_size == 1 and d.nnodes == 1:
        return "[distributed] world_size = 1 on one node: nothing to distribute"
    return None
