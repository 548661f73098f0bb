"""``MLP``: a ``Sequential`` of Linear layers with an activation (and dropout) between them."""
from __future__ import annotations

from typing import Any, Sequence

from ..nn import GELU, Dropout, Linear, ReLU, Sequential, Sigmoid, Tanh

ACTIVATIONS = {"relu": ReLU, "gelu": GELU, "tanh": Tanh, "sigmoid": Sigmoid}


class MLP(Sequential):
    """``MLP([784, 256, 10])`` = Linear(784, 256), ReLU, Linear(256, 10).

    Each hidden layer is followed by ``activation`` and, when ``dropout > 0``, a Dropout; the
    output layer has neither.
    """

    def __init__(self, sizes: Sequence[int], activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True, dtype: Any = None) -> None:
        sizes = [int(n) for n in sizes]
        if len(sizes) < 2 or any(n < 1 for n in sizes):
            raise ValueError(f"MLP needs at least two positive layer sizes, got {list(sizes)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from "
                             f"{sorted(ACTIVATIONS)}")
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(Linear(fan_in, fan_out, bias=bias, dtype=dtype))
            if i < len(sizes) - 2:
                layers.append(ACTIVATIONS[activation]())
                if dropout > 0.0:
                    layers.append(Dropout(dropout))
        super().__init__(*layers)
        self.sizes, self.activation = sizes, activation
