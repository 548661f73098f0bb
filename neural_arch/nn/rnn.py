"""Multi-layer recurrent layers with PyTorch's API: ``RNN``, ``LSTM``, ``GRU``.

Parameters, their names, shapes, gate order and initialisation are PyTorch's, so a
``state_dict`` loads into ``torch.nn.LSTM`` (and back) unchanged. Each layer and direction is one
fused op from ``core.ops_rnn`` over the whole sequence.
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, List, Optional, Tuple

import numpy as np

from .. import functional as F
from ..backends import xp_of
from ..core import Tensor, concatenate, stack
from ..core.ops_rnn import gru_layer, lstm_layer, rnn_layer
from . import init
from ._dtype import as_tensor, parameter_dtype
from .module import Module
from .parameter import Parameter

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def check_sizes(kind: str, input_size: Any, hidden_size: Any) -> None:
    for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{kind}: {name} should be of type int, got "
                            f"{type(value).__name__} ({value!r})")
    if input_size < 0 or hidden_size <= 0:
        raise ValueError(f"{kind}: need input_size >= 0 and hidden_size > 0, got "
                         f"input_size={input_size}, hidden_size={hidden_size}")


def zero_state(like: Tensor, shape: Tuple[int, ...], dtype: Any) -> Tensor:
    """A zero initial state on the device of ``like``."""
    return Tensor(xp_of(like.array).zeros(shape, dtype=dtype))


def run_layer(mode: str, x: Tensor, h0: Tensor, c0: Optional[Tensor],
              weights: List[Optional[Parameter]], reverse: bool) -> Tuple[Tensor, ...]:
    """One layer and direction over x (T, B, I): (outputs (T, B, H), h_n, c_n or None)."""
    length = x.shape[0]
    last = 0 if reverse else length - 1
    if mode == "LSTM":
        packed = lstm_layer(x, h0, c0, *weights, reverse=reverse)
        return packed[:length], packed[last], packed[length]
    if mode == "GRU":
        out = gru_layer(x, h0, *weights, reverse=reverse)
    else:
        nonlinearity = "tanh" if mode == "RNN_TANH" else "relu"
        out = rnn_layer(x, h0, *weights, reverse=reverse, nonlinearity=nonlinearity)
    return out, out[last], None


class RecurrentModule(Module):
    """Base of the recurrent layers and cells: every parameter is initialised as torch's,
    U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""

    hidden_size: int

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for param in self.parameters():
            init.uniform_(param, -bound, bound)


class RNNBase(RecurrentModule):
    """Shared by ``RNN``, ``LSTM`` and ``GRU``: parameters, state checks and the layer loop."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        kind = type(self).__name__
        check_sizes(kind, input_size, hidden_size)
        if not isinstance(num_layers, numbers.Integral) or num_layers <= 0:
            raise ValueError(f"{kind}: num_layers must be a positive int, got {num_layers!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Number) \
                or not 0 <= dropout <= 1:
            raise ValueError(f"{kind}: dropout should be a number in range [0, 1] representing "
                             f"the probability of an element being zeroed, got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{kind}: dropout option adds dropout after all but last recurrent "
                          f"layer, so non-zero dropout expects num_layers greater than 1, but "
                          f"got dropout={dropout} and num_layers={num_layers}")
        if proj_size != 0:
            raise NotImplementedError(f"{kind}: proj_size={proj_size} (LSTM with projections) is "
                                      f"not supported; use proj_size=0")
        self.mode = mode
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.bias = int(num_layers), bool(bias)
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        self.bidirectional, self.proj_size = bool(bidirectional), 0
        dtype = parameter_dtype(dtype)
        directions = 2 if self.bidirectional else 1
        rows = _GATES[mode] * self.hidden_size
        self._flat_weights_names: List[str] = []
        for layer in range(self.num_layers):
            layer_input = self.input_size if layer == 0 else self.hidden_size * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
                shapes = [("weight_ih", (rows, layer_input)), ("weight_hh", (rows, hidden_size))]
                if self.bias:
                    shapes += [("bias_ih", (rows,)), ("bias_hh", (rows,))]
                for name, shape in shapes:
                    self.register_parameter(name + suffix, Parameter(np.empty(shape, dtype)))
                    self._flat_weights_names.append(name + suffix)
        self.reset_parameters()
        if device is not None:
            self.to(device)

    def flatten_parameters(self) -> None:
        """Kept for PyTorch compatibility: the weights are never packed, so nothing to do."""

    @property
    def all_weights(self) -> List[List[Parameter]]:
        per_layer = 4 if self.bias else 2
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[i:i + per_layer]]
                for i in range(0, len(names), per_layer)]

    def _layer_weights(self, layer: int, direction: int) -> List[Optional[Parameter]]:
        suffix = f"_l{layer}" + ("_reverse" if direction == 1 else "")
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return [getattr(self, n + suffix) if self.bias or n.startswith("weight") else None
                for n in names]

    def _initial_state(self, x: Tensor, hx: Any, batched: bool, what: str) -> Tensor:
        """``hx`` (num_layers * directions, B, H) as given, or zeros, checked against x."""
        directions = 2 if self.bidirectional else 1
        shape = (self.num_layers * directions, x.shape[1], self.hidden_size)
        if hx is None:
            return zero_state(x, shape, self.weight_ih_l0.dtype)
        state = as_tensor(hx)
        if not batched:
            if state.ndim != 2:
                raise ValueError(f"{type(self).__name__}: for unbatched 2-D input, {what} "
                                 f"should also be 2-D but got {state.ndim}-D, shape "
                                 f"{tuple(state.shape)}")
            state = state.unsqueeze(1)
        if tuple(state.shape) != shape:
            raise ValueError(f"{type(self).__name__}: expected {what} of shape {shape}, got "
                             f"{tuple(state.shape)}")
        return state

    def _split_hx(self, hx: Any) -> Tuple[Any, Any]:
        if self.mode != "LSTM":
            if isinstance(hx, (tuple, list)):
                raise TypeError(f"{type(self).__name__}: hx must be a tensor, got a "
                                f"{type(hx).__name__}")
            return hx, None
        if hx is None:
            return None, None
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LSTM: hx must be a tuple (h_0, c_0), got {type(hx).__name__}")
        return hx[0], hx[1]

    def forward(self, input: Any, hx: Any = None) -> Tuple[Tensor, Any]:
        kind = type(self).__name__
        x = as_tensor(input)
        if x.ndim not in (2, 3):
            raise ValueError(f"{kind}: expected input to be 2-D (unbatched) or 3-D (batched), "
                             f"got {x.ndim}-D, shape {tuple(x.shape)}")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{kind}: input.size(-1) must be equal to input_size. Expected "
                             f"{self.input_size}, got {x.shape[-1]} (input shape "
                             f"{tuple(x.shape)})")
        batched = x.ndim == 3
        if not batched:
            x = x.unsqueeze(1)
        elif self.batch_first:
            x = x.swapaxes(0, 1)
        h_given, c_given = self._split_hx(hx)
        h0 = self._initial_state(x, h_given, batched, "hx" if self.mode != "LSTM" else "h_0")
        c0 = self._initial_state(x, c_given, batched, "c_0") if self.mode == "LSTM" else None
        directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                out, h_last, c_last = run_layer(
                    self.mode, x, h0[k], None if c0 is None else c0[k],
                    self._layer_weights(layer, direction), reverse=direction == 1)
                outputs.append(out)
                h_n.append(h_last)
                c_n.append(c_last)
            x = outputs[0] if directions == 1 else concatenate(outputs, axis=2)
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, True)
        h_stack = stack(h_n, axis=0)
        c_stack = stack(c_n, axis=0) if self.mode == "LSTM" else None
        if not batched:
            x = x.squeeze(1)
            h_stack = h_stack.squeeze(1)
            c_stack = None if c_stack is None else c_stack.squeeze(1)
        elif self.batch_first:
            x = x.swapaxes(0, 1)
        return x, (h_stack if c_stack is None else (h_stack, c_stack))

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False),
                              ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        if self.mode == "RNN_RELU":
            text += ", nonlinearity='relu'"
        return text


class LSTM(RNNBase):
    """Long short-term memory; ``forward(input, (h_0, c_0)=None) -> (output, (h_n, c_n))``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device: Any = None, dtype: Any = None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)


class GRU(RNNBase):
    """Gated recurrent unit; ``forward(input, h_0=None) -> (output, h_n)``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, 0, device, dtype)


class RNN(RNNBase):
    """Elman RNN with ``tanh`` or ``relu``; ``forward(input, h_0=None) -> (output, h_n)``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: unknown nonlinearity {nonlinearity!r} "
                             f"(expected 'tanh' or 'relu')")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional, 0,
                         device, dtype)
        self.nonlinearity = nonlinearity
