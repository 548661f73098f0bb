"""Single-step recurrent cells with PyTorch's API: ``RNNCell``, ``LSTMCell``, ``GRUCell``.

A cell step is the fused layer op of ``core.ops_rnn`` over a sequence of length one, so cells
and the multi-layer modules share one implementation (and one set of gradient formulas).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ..core import Tensor
from ..core.ops_rnn import gru_layer, lstm_layer, rnn_layer
from ._dtype import as_tensor, parameter_dtype
from .parameter import Parameter
from .rnn import RecurrentModule, check_sizes, zero_state


class RNNCellBase(RecurrentModule):
    """Parameters ``weight_ih`` (gates * hidden, input), ``weight_hh`` (gates * hidden,
    hidden), ``bias_ih`` and ``bias_hh`` (gates * hidden), all U(-1/sqrt(hidden), ...)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, gates: int,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        check_sizes(type(self).__name__, input_size, hidden_size)
        self.input_size, self.hidden_size, self.bias = int(input_size), int(hidden_size), bias
        dtype = parameter_dtype(dtype)
        rows = gates * self.hidden_size
        self.weight_ih = Parameter(np.empty((rows, self.input_size), dtype=dtype))
        self.weight_hh = Parameter(np.empty((rows, self.hidden_size), dtype=dtype))
        if bias:
            self.bias_ih = Parameter(np.empty(rows, dtype=dtype))
            self.bias_hh = Parameter(np.empty(rows, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()
        if device is not None:
            self.to(device)

    def _weights(self) -> Tuple[Any, ...]:
        return self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh

    def _prepare(self, input: Any) -> Tuple[Tensor, bool]:
        """The input as a length-one sequence (1, B, input_size), and whether it was batched."""
        x = as_tensor(input)
        kind = type(self).__name__
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ValueError(f"{kind}: expected input of shape (batch, {self.input_size}) or "
                             f"({self.input_size},), got {tuple(x.shape)}")
        batched = x.ndim == 2
        return (x if batched else x.unsqueeze(0)).unsqueeze(0), batched

    def _state(self, x: Tensor, hx: Any, batched: bool, what: str) -> Tensor:
        """``hx`` as (B, hidden), or zeros; it must be batched exactly when the input is."""
        batch = x.shape[1]
        if hx is None:
            return zero_state(x, (batch, self.hidden_size), self.weight_ih.dtype)
        state = as_tensor(hx)
        expected = (batch, self.hidden_size) if batched else (self.hidden_size,)
        if tuple(state.shape) != expected:
            raise ValueError(f"{type(self).__name__}: expected {what} of shape {expected} for "
                             f"input of batch {batch if batched else 'none (unbatched)'}, got "
                             f"{tuple(state.shape)}")
        return state if batched else state.unsqueeze(0)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            text += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            text += f", nonlinearity={self.nonlinearity!r}"
        return text


def _unbatch(state: Tensor, batched: bool) -> Tensor:
    return state if batched else state.squeeze(0)


class LSTMCell(RNNCellBase):
    """``forward(input, (h, c)=None) -> (h', c')``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input: Any, hx: Optional[Tuple[Any, Any]] = None
                ) -> Tuple[Tensor, Tensor]:
        x, batched = self._prepare(input)
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError(f"LSTMCell: hx must be a tuple (h, c), got {type(hx).__name__}")
        h0 = self._state(x, None if hx is None else hx[0], batched, "h")
        c0 = self._state(x, None if hx is None else hx[1], batched, "c")
        packed = lstm_layer(x, h0, c0, *self._weights())
        return _unbatch(packed[0], batched), _unbatch(packed[1], batched)


class GRUCell(RNNCellBase):
    """``forward(input, h=None) -> h'``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input: Any, hx: Any = None) -> Tensor:
        x, batched = self._prepare(input)
        h0 = self._state(x, hx, batched, "hx")
        return _unbatch(gru_layer(x, h0, *self._weights())[0], batched)


class RNNCell(RNNCellBase):
    """``h' = nonlinearity(W_ih x + b_ih + W_hh h + b_hh)``; ``forward(input, h=None) -> h'``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device: Any = None, dtype: Any = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: unknown nonlinearity {nonlinearity!r} "
                             f"(expected 'tanh' or 'relu')")
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Any, hx: Any = None) -> Tensor:
        x, batched = self._prepare(input)
        h0 = self._state(x, hx, batched, "hx")
        out = rnn_layer(x, h0, *self._weights(), nonlinearity=self.nonlinearity)
        return _unbatch(out[0], batched)
