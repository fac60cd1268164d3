"""Multi-GPU readiness through torchrun: ``launcher`` starts ONE ``python -m
torch.distributed.run`` job in its own session, collects every rank's output and result,
enforces the timeout and diagnoses a rank that cannot join or dies; ``rank_worker`` is what
each rank runs (join, collectives, one DDP/FSDP2 step, a sharded checkpoint and its resume).
Plain Python over torch; imports nothing of pytest and no check module."""
