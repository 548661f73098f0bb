"""The global batches of a ``--pp`` run: every rank draws the same whole batch of a step.

``GPT3D.train_step`` takes the global batch on every rank and gives dp replica ``r`` rows
``[r*b, (r+1)*b)``. So that a pipeline run reads what the data-parallel program (``--pp 1``)
reads, the global batch of step ``k`` is the concatenation, over the dp replicas, of the
``k``-th batch of ``b`` windows that replica's ``DistributedSampler`` gives there: the same
shuffle (``seed + epoch``), the same split, and at dp = 1 the very same batches. The one
difference: a short last batch of an epoch is used only when its rows still split into the
micro-batches; otherwise the epoch ends without it.
"""
from __future__ import annotations

from typing import Iterator, List, Tuple

import numpy as np

from ..distributed import DistributedSampler
from .text import TokenWindows


class GlobalBatches:
    """``epoch(e)`` yields the global batches ``(idx, targets)`` of epoch ``e``, each
    ``replicas`` x (``per_replica`` or fewer) windows; ``len()`` is batches per epoch."""

    def __init__(self, windows: TokenWindows, per_replica: int, replicas: int,
                 microbatches: int, shuffle: bool, seed: int) -> None:
        self.windows = windows
        self.samplers = [DistributedSampler(len(windows), num_replicas=replicas, rank=r,
                                            shuffle=shuffle, seed=seed)
                         for r in range(replicas)]
        share = len(self.samplers[0])  # the same for every replica (the sampler pads)
        full, rest = divmod(share, per_replica)
        self.sizes: List[int] = [per_replica] * full
        if rest and rest % microbatches == 0:
            self.sizes.append(rest)

    def __len__(self) -> int:
        return len(self.sizes)

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """The batches of ``epoch`` after its first ``skip`` (a resumed run's position)."""
        orders = []
        for sampler in self.samplers:
            sampler.set_epoch(epoch)
            orders.append(sampler.indices())
        start = sum(self.sizes[:skip])
        for size in self.sizes[skip:]:
            rows = np.concatenate([order[start:start + size] for order in orders])
            yield self.windows._fetch_batch(rows)
            start += size
