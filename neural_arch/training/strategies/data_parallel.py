"""``DataParallel`` ("ddp"): every rank a whole replica, gradients averaged over the group.

``overlap=True`` (the default) lets DDP's hooks all-reduce each bucket as soon as backward has
produced its gradients, so communication runs behind the rest of backward; ``overlap=False``
averages after backward, in one timed sync (the same gradients: the tests check bit for bit).
"""
from __future__ import annotations

from .wrapped import WrappedStep


class DataParallel(WrappedStep):
    name = "ddp"
    zero_stage = 0
