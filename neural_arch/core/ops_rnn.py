"""Recurrent layers as fused autograd ops: one graph node per layer and direction.

Each op runs a whole sequence: the input projection of every time step is one matrix product
(``x @ w_ih.T`` over all (time, batch) rows), then a loop over time does only the recurrent
product and the gate arithmetic. The backward walks the steps in reverse once and again puts
the weight and input gradients in single products over all steps. Compared with composing
matmul / sigmoid / slicing ops per step this keeps a few hundred graph nodes and temporaries
per sequence out of the engine, which dominates the cost at language-model sizes.

A node has one output, so each op returns its results packed along the time axis: rows
``0 .. T-1`` hold the hidden state after each time step (in time order, also when the
direction is reversed), and for the LSTM a last row ``T`` holds the final cell state.
Slicing that tensor gives the output sequence, ``h_n`` and ``c_n`` with their gradients.

Gate layouts and formulas are PyTorch's: LSTM rows (i, f, g, o); GRU rows (r, z, n) with
``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`` and ``h' = (1 - z) * n + z * h``.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from ..backends import xp_of
from .tensor import Tensor, make_result


def _sigmoid(xp: Any, x: Any) -> Any:
    # the tanh form never overflows and costs one transcendental per element
    return 0.5 + 0.5 * xp.tanh(0.5 * x)


def _check(op: str, gates: int, x: Tensor, states: Tuple[Tensor, ...], w_ih: Tensor,
           w_hh: Tensor, b_ih: Optional[Tensor], b_hh: Optional[Tensor]) -> Tuple[int, ...]:
    """(T, B, I, H) after checking every shape and dtype against the weights."""
    xs, wi, wh = x.shape, w_ih.shape, w_hh.shape
    if len(wh) != 2 or wh[0] != gates * wh[1]:
        raise ValueError(f"{op}: weight_hh shape {wh} is not ({gates} * hidden, hidden)")
    hidden = wh[1]
    if len(xs) != 3 or xs[0] == 0:
        raise ValueError(f"{op}: input must be (seq_len >= 1, batch, features), got {xs}")
    if wi != (gates * hidden, xs[2]):
        raise ValueError(f"{op}: weight_ih shape {wi} does not match input shape {xs} "
                         f"(expected ({gates * hidden}, {xs[2]}))")
    for name, bias in (("bias_ih", b_ih), ("bias_hh", b_hh)):
        if bias is not None and bias.shape != (gates * hidden,):
            raise ValueError(f"{op}: {name} shape {bias.shape} is not ({gates * hidden},)")
    for name, state in zip(("h0", "c0"), states):
        if state.shape != (xs[1], hidden):
            raise ValueError(f"{op}: {name} shape {state.shape} is not (batch, hidden) = "
                             f"({xs[1]}, {hidden})")
    tensors = (x,) + states + (w_ih, w_hh) + tuple(b for b in (b_ih, b_hh) if b is not None)
    dtypes = {str(t.dtype) for t in tensors}
    if len(dtypes) != 1:
        raise TypeError(f"{op}: input, states and weights must share one dtype, got input "
                        f"{x.dtype}, weight_ih {w_ih.dtype}, states "
                        f"{[str(s.dtype) for s in states]}")
    return xs[0], xs[1], xs[2], hidden


def _same_dtype(g: Any, like: Any) -> Any:
    # the engine passes gradients on in whatever dtype they arrive (a float64 loss downstream
    # of float32 states makes them float64); the recurrence runs in the layer's dtype
    return g if g.dtype == like.dtype else g.astype(like.dtype)


def _steps(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


def _project_input(x: Tensor, w_ih: Tensor, bias: Any) -> Tuple[Any, Any]:
    """(x as (T*B, I) rows, x @ w_ih.T + bias as (T, B, gates * H))."""
    xd = x.array
    rows = xd.reshape(-1, xd.shape[2])
    projected = rows @ w_ih.array.T
    if bias is not None:
        projected += bias
    return rows, projected.reshape(xd.shape[0], xd.shape[1], -1)


def _weight_grads(x: Tensor, rows: Any, w_ih: Tensor, d_in: Any, d_rec: Any, h_prev: Any,
                  biases: Tuple[Optional[Tensor], ...]) -> tuple:
    """Gradients of x, w_ih, w_hh and the biases from the per-step gate gradients."""
    length, batch = d_in.shape[:2]
    d_in2 = d_in.reshape(length * batch, -1)
    d_rec2 = d_rec.reshape(length * batch, -1)
    gx = (d_in2 @ w_ih.array).reshape(x.shape) if x.requires_grad else None
    g_wih = d_in2.T @ rows
    g_whh = d_rec2.T @ h_prev.reshape(length * batch, -1)
    g_bias = tuple(d.sum(axis=0) for b, d in zip(biases, (d_in2, d_rec2)) if b is not None)
    return (gx, g_wih, g_whh) + g_bias


def _parents(*tensors: Optional[Tensor]) -> Tuple[Tensor, ...]:
    return tuple(t for t in tensors if t is not None)


def _summed_bias(b_ih: Optional[Tensor], b_hh: Optional[Tensor]) -> Any:
    if b_ih is None:
        return None if b_hh is None else b_hh.array
    return b_ih.array if b_hh is None else b_ih.array + b_hh.array


def lstm_layer(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor,
               b_ih: Optional[Tensor] = None, b_hh: Optional[Tensor] = None,
               reverse: bool = False) -> Tensor:
    """One LSTM layer over x (T, B, I); returns (T + 1, B, H): the T outputs, then c_n."""
    length, batch, _, hidden = _check("lstm_layer", 4, x, (h0, c0), w_ih, w_hh, b_ih, b_hh)
    xp, H = xp_of(x.array), hidden
    rows, gates_in = _project_input(x, w_ih, _summed_bias(b_ih, b_hh))
    w_hh_t = w_hh.array.T
    acts = xp.empty_like(gates_in)
    tanh_c = xp.empty((length, batch, H), dtype=gates_in.dtype)
    h_prev, c_prev = xp.empty_like(tanh_c), xp.empty_like(tanh_c)
    out = xp.empty((length + 1, batch, H), dtype=gates_in.dtype)
    h, c = h0.array, c0.array
    for t in _steps(length, reverse):
        h_prev[t], c_prev[t] = h, c
        a = acts[t]
        xp.add(gates_in[t], h @ w_hh_t, out=a)
        a[:, :2 * H] = _sigmoid(xp, a[:, :2 * H])
        a[:, 2 * H:3 * H] = xp.tanh(a[:, 2 * H:3 * H])
        a[:, 3 * H:] = _sigmoid(xp, a[:, 3 * H:])
        c = a[:, H:2 * H] * c + a[:, :H] * a[:, 2 * H:3 * H]
        tanh_c[t] = xp.tanh(c)
        h = out[t] = a[:, 3 * H:] * tanh_c[t]
    out[length] = c

    def backward(g: Any) -> tuple:
        g = _same_dtype(g, out)
        d_gates = xp.empty_like(acts)
        dh, dc = xp.zeros_like(h_prev[0]), g[length]
        for t in _steps(length, not reverse):
            a, tc, d = acts[t], tanh_c[t], d_gates[t]
            i, f, gg, o = a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:]
            dh = dh + g[t]
            dc = dc + dh * o * (1 - tc * tc)
            d[:, :H] = dc * gg * i * (1 - i)
            d[:, H:2 * H] = dc * c_prev[t] * f * (1 - f)
            d[:, 2 * H:3 * H] = dc * i * (1 - gg * gg)
            d[:, 3 * H:] = dh * tc * o * (1 - o)
            dc = dc * f
            dh = d @ w_hh.array
        x_w = _weight_grads(x, rows, w_ih, d_gates, d_gates, h_prev, (b_ih, b_hh))
        return (x_w[0], dh, dc) + x_w[1:]

    return make_result(out, _parents(x, h0, c0, w_ih, w_hh, b_ih, b_hh), backward)


def gru_layer(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor,
              b_ih: Optional[Tensor] = None, b_hh: Optional[Tensor] = None,
              reverse: bool = False) -> Tensor:
    """One GRU layer over x (T, B, I); returns the hidden states (T, B, H)."""
    length, batch, _, hidden = _check("gru_layer", 3, x, (h0,), w_ih, w_hh, b_ih, b_hh)
    xp, H = xp_of(x.array), hidden
    # b_hh stays out of the input projection: its n part is scaled by r
    rows, gates_in = _project_input(x, w_ih, None if b_ih is None else b_ih.array)
    w_hh_t = w_hh.array.T
    rz = xp.empty((length, batch, 2 * H), dtype=gates_in.dtype)
    new, rec_new = xp.empty((2, length, batch, H), dtype=gates_in.dtype)
    h_prev = xp.empty_like(new)
    out = xp.empty_like(new)
    h = h0.array
    for t in _steps(length, reverse):
        h_prev[t] = h
        gates_h = h @ w_hh_t
        if b_hh is not None:
            gates_h += b_hh.array
        rz[t] = _sigmoid(xp, gates_in[t, :, :2 * H] + gates_h[:, :2 * H])
        rec_new[t] = gates_h[:, 2 * H:]
        new[t] = xp.tanh(gates_in[t, :, 2 * H:] + rz[t, :, :H] * rec_new[t])
        h = out[t] = new[t] + rz[t, :, H:] * (h - new[t])

    def backward(g: Any) -> tuple:
        g = _same_dtype(g, out)
        d_in = xp.empty_like(gates_in)
        d_rec = xp.empty_like(gates_in)
        dh = xp.zeros_like(h_prev[0])
        for t in _steps(length, not reverse):
            r, z, n = rz[t, :, :H], rz[t, :, H:], new[t]
            dh = dh + g[t]
            dn = dh * (1 - z) * (1 - n * n)
            d_in[t, :, :H] = d_rec[t, :, :H] = dn * rec_new[t] * r * (1 - r)
            d_in[t, :, H:2 * H] = d_rec[t, :, H:2 * H] = dh * (h_prev[t] - n) * z * (1 - z)
            d_in[t, :, 2 * H:] = dn
            d_rec[t, :, 2 * H:] = dn * r
            dh = dh * z + d_rec[t] @ w_hh.array
        x_w = _weight_grads(x, rows, w_ih, d_in, d_rec, h_prev, (b_ih, b_hh))
        return (x_w[0], dh) + x_w[1:]

    return make_result(out, _parents(x, h0, w_ih, w_hh, b_ih, b_hh), backward)


def rnn_layer(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor,
              b_ih: Optional[Tensor] = None, b_hh: Optional[Tensor] = None,
              reverse: bool = False, nonlinearity: str = "tanh") -> Tensor:
    """One Elman RNN layer ``h' = act(W_ih x + b_ih + W_hh h + b_hh)``; returns (T, B, H)."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"rnn_layer: unknown nonlinearity {nonlinearity!r} "
                         f"(expected 'tanh' or 'relu')")
    length, _, _, _ = _check("rnn_layer", 1, x, (h0,), w_ih, w_hh, b_ih, b_hh)
    xp = xp_of(x.array)
    rows, pre = _project_input(x, w_ih, _summed_bias(b_ih, b_hh))
    w_hh_t = w_hh.array.T
    out = xp.empty_like(pre)
    h_prev = xp.empty_like(pre)
    h = h0.array
    for t in _steps(length, reverse):
        h_prev[t] = h
        total = pre[t] + h @ w_hh_t
        h = out[t] = xp.tanh(total) if nonlinearity == "tanh" else xp.maximum(total, 0)

    def backward(g: Any) -> tuple:
        g = _same_dtype(g, out)
        d_pre = xp.empty_like(pre)
        dh = xp.zeros_like(h_prev[0])
        for t in _steps(length, not reverse):
            dh = dh + g[t]
            local = 1 - out[t] * out[t] if nonlinearity == "tanh" else out[t] > 0
            d_pre[t] = dh * local
            dh = d_pre[t] @ w_hh.array
        x_w = _weight_grads(x, rows, w_ih, d_pre, d_pre, h_prev, (b_ih, b_hh))
        return (x_w[0], dh) + x_w[1:]

    return make_result(out, _parents(x, h0, w_ih, w_hh, b_ih, b_hh), backward)
