"""Communication hooks for ``DistributedDataParallel.register_comm_hook`` (PyTorch's
``torch.distributed.algorithms.ddp_comm_hooks``): what DDP does with each bucket of gradients.

``bucket`` holds what a hook gets (``GradBucket``; it returns a ``Future``, from ``work``); ``default_hooks``
the exact average (``allreduce_hook``), its float16 form (``fp16_compress_hook``) and
``CommHookState``, which counts the bytes a hook sends; ``powersgd`` low-rank compression
(``PowerSGDState``) and ``topk`` top-k sparsification (``TopKState``), both with error
feedback; ``ddp_zero_hook`` wraps any of them so that ``ZeroRedundancyOptimizer(...,
overlap_with_ddp=True)`` steps inside backward (``hook_with_zero_step``). Torch's module
paths (``neural_arch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook``, ``.default_hooks``,
``.powerSGD_hook``) name these same modules.

    state = PowerSGDState(process_group=None, matrix_approximation_rank=4)
    ddp.register_comm_hook(state, powerSGD_hook)
"""
from __future__ import annotations

from ..._lazy import lazy_names

_LAZY = {
    "GradBucket": ".bucket",
    "Future": "..work",
    "CommHookState": ".default_hooks",
    "allreduce_hook": ".default_hooks",
    "fp16_compress_hook": ".default_hooks",
    "PowerSGDState": ".powersgd",
    "powerSGD_hook": ".powersgd",
    "TopKState": ".topk",
    "topk_hook": ".topk",
    "hook_with_zero_step": ".ddp_zero_hook",
    "hook_with_zero_step_interleaved": ".ddp_zero_hook",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = sorted(_LAZY)
