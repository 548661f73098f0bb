"""What the experiment trackers (``MLflowLogger``, ``TensorBoardLogger``) share: the check for
their optional package, made before any worker starts, and the numbers they record."""
from __future__ import annotations

import importlib.util
import math
from typing import Any, Dict

_SKIPPED_KEYS = ("step", "epoch", "time")  # the axis, not metrics


def require_package(module: str, owner: str, purpose: str, extra: str) -> None:
    """RuntimeError naming the extra to install when ``module`` is missing."""
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(f"{owner}: {purpose} the {module} package, which is not installed; "
                           f"pip install 'neural-arch[{extra}]'")


def tagged_numbers(values: Dict[str, Any], prefix: str) -> Dict[str, float]:
    """The finite numbers of ``values`` (no flags, no axis keys) under ``prefix/``."""
    found = {}
    for key, value in values.items():
        if key in _SKIPPED_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            found[f"{prefix}/{key}"] = float(value)
    return found
