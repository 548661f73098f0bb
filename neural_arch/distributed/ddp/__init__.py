"""Data-parallel training: every rank holds the whole model and gradients are averaged.

``data_parallel`` is ``DistributedDataParallel`` (flat buckets, overlapped with backward;
``step_sync`` launches, waits for and unpacks a step's buckets), ``buckets`` where its buckets
live (private or shared memory), ``hook_plan`` what a communication hook does with each bucket
(``wire``: buckets packed in float16 under the fp16 hook), ``naive`` the one-all-reduce-per-
parameter version kept for reading, ``advanced`` DDP plus accumulation, clipping, mixed
precision (``half_precision``) and ZeRO stages (its settings: ``training_config``; its
optimizer: ``stage_optimizer``), ``loss_scaler`` float16 loss scaling, and ``sampler`` the
``DistributedSampler`` that gives each rank its share of the data.

The names below are imported on first use, so importing one module here (the sampler, say)
does not pull in the model code of the others.
"""
from __future__ import annotations

from ..._lazy import lazy_names

_LAZY = {
    "DistributedDataParallel": ".data_parallel",
    "NaiveDistributedDataParallel": ".naive",
    "AdvancedDistributedDataParallel": ".advanced",
    "DistributedTrainingConfig": ".training_config",
    "LossScaler": ".loss_scaler",
    "DistributedSampler": ".sampler",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = sorted(_LAZY)
