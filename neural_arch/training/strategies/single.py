"""``SingleProcess`` ("single"): the whole model and batch in one process.

The step is the data-parallel one with nothing to average (accumulation, clipping, mixed
precision and the loss scaler are the same code); refused on a group of several ranks, where
each would train alone on its own share.
"""
from __future__ import annotations

from typing import Any

from ...distributed import get_world_size
from .wrapped import WrappedStep


class SingleProcess(WrappedStep):
    name = "single"

    def _check(self, model: Any, config: Any, group: Any) -> None:
        super()._check(model, config, group)
        ranks = get_world_size(group)
        if ranks != 1:
            raise ValueError(f"strategy 'single' trains in one process, but the data group has "
                             f"{ranks} ranks; use 'ddp' (or another data-parallel strategy)")
