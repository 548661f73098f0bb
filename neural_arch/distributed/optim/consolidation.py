"""The error both ZeRO optimizers raise from ``state_dict()`` where the full state is not."""
from __future__ import annotations


def not_consolidated(who: str, global_rank: int, world_size: int) -> RuntimeError:
    """``who``'s ``state_dict()`` on ``global_rank``, which did not receive the consolidated
    state since the last step: what to call first, and where."""
    return RuntimeError(
        f"{who}.state_dict() on rank {global_rank}: the optimizer state is sharded over "
        f"{world_size} ranks and has not been consolidated here since the last step(); call "
        f"consolidate_state_dict(to=rank) on every rank first, then state_dict() on that rank")


__all__ = ["not_consolidated"]
