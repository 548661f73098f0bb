"""``Generator``: torch's random-generator object over a ``numpy.random.Generator``.

Sampling functions take it as ``generator=``; ``resolve_generator`` turns that argument (a
``Generator``, a NumPy generator, or None for the global one of ``core.random``) into the
NumPy generator they draw from. The streams differ from torch's: the same seed gives
reproducible, not identical, numbers.
"""
from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np

from .random import get_rng
from .torch_device import device as Device

DEFAULT_SEED = 67280421310721  # what a fresh torch.Generator reports as initial_seed()
_SEED_SPAN = 1 << 64


class Generator:
    """``Generator(device="cpu")`` with ``manual_seed``, ``seed``, ``initial_seed`` and
    ``get_state`` / ``set_state`` (the state is the NumPy bit generator's dict)."""

    def __init__(self, device: Any = "cpu") -> None:
        self.device = Device(device)
        self.manual_seed(DEFAULT_SEED)

    def manual_seed(self, seed: Any) -> "Generator":
        """Reseed; negative seeds wrap to 64 bits as in torch. Returns the generator."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"manual_seed expected an int, got {type(seed).__name__} {seed!r}")
        seed = int(seed)
        if not -(1 << 63) <= seed < _SEED_SPAN:
            raise RuntimeError(f"seed {seed} is outside [-2**63, 2**64)")
        self._initial = seed % _SEED_SPAN
        self.numpy_generator = np.random.default_rng(self._initial)
        return self

    def seed(self) -> int:
        """Reseed from the operating system's entropy and return the new seed."""
        fresh = int.from_bytes(os.urandom(8), "little")
        self.manual_seed(fresh)
        return fresh

    def initial_seed(self) -> int:
        return self._initial

    def get_state(self) -> dict:
        return copy.deepcopy(self.numpy_generator.bit_generator.state)

    def set_state(self, state: dict) -> "Generator":
        self.numpy_generator.bit_generator.state = copy.deepcopy(state)
        return self

    def __repr__(self) -> str:
        return f"<neural_arch.Generator device={self.device!s} initial_seed={self._initial}>"


def resolve_generator(generator: Any = None, rng: Any = None) -> np.random.Generator:
    """The NumPy generator to draw from: ``generator`` (or the older ``rng=``), else the
    global one."""
    if generator is not None and rng is not None:
        raise ValueError("pass either generator= or rng=, not both")
    chosen = generator if generator is not None else rng
    if chosen is None:
        return get_rng()
    if isinstance(chosen, Generator):
        return chosen.numpy_generator
    if isinstance(chosen, np.random.Generator):
        return chosen
    raise TypeError(f"generator must be a neural_arch.Generator or a numpy.random.Generator, "
                    f"got {type(chosen).__name__}")
