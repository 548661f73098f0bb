"""The framework's global random generator (used by initialisers, dropout and factories)."""
from __future__ import annotations

from typing import Optional

import numpy as np

_generator = np.random.default_rng()


def get_rng() -> np.random.Generator:
    """The global ``numpy.random.Generator``; reseed it with ``manual_seed``."""
    return _generator


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the global generator so that runs are reproducible; returns the new generator."""
    global _generator
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    _generator = np.random.default_rng(int(seed))
    return _generator


def set_rng(generator: np.random.Generator) -> np.random.Generator:
    """Make ``generator`` the global one (as ``manual_seed`` does with a new one); returns the
    one it replaces, so that a caller can put it back (activation checkpointing replays the
    draws of a forward on the generator that made them)."""
    global _generator
    if not isinstance(generator, np.random.Generator):
        raise TypeError(f"set_rng needs a numpy.random.Generator, got {type(generator).__name__}")
    previous, _generator = _generator, generator
    return previous


def resolve_rng(seed: Optional[int] = None, rng: Optional[np.random.Generator] = None
                ) -> np.random.Generator:
    """``rng`` if given, else a fresh generator from ``seed``, else the global one."""
    if rng is not None and seed is not None:
        raise ValueError(f"pass either seed ({seed}) or rng, not both")
    if rng is not None:
        return rng
    if seed is not None:
        return np.random.default_rng(seed)
    return _generator
