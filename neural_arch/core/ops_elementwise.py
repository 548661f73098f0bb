"""Elementwise operations: arithmetic (with broadcasting), unary math and comparisons."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ..backends import xp_of
from .bfloat16 import BFLOAT16, involves_bfloat16, promote_operands, round_like
from .broadcast import unbroadcast
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node
from .versions import modified_error

_PY_SCALARS = (int, float, bool)


def operand(value: Any, like: Tensor) -> Tuple[Any, Optional[Tensor]]:
    """(array or Python scalar, the Tensor it came from or None) for the other side of an op."""
    if isinstance(value, Tensor):
        return value.array, value
    if isinstance(value, _PY_SCALARS) or hasattr(value, "shape"):
        return value, None
    array = xp_of(like.array).asarray(value)
    like_dtype = like.array.dtype
    if array.dtype.kind == "f" and (like_dtype.kind == "f" or like_dtype == BFLOAT16):
        array = array.astype(like_dtype)
    return array, None


def _shape(value: Any) -> Tuple[int, ...]:
    return tuple(getattr(value, "shape", ()))


def broadcast_error(op: str, left: Any, right: Any) -> ValueError:
    return ValueError(f"{op}: cannot broadcast shapes {_shape(left)} and {_shape(right)}")


def _binary(op: str, a: Tensor, b: Any, forward: Callable, grad_a: Callable,
            grad_b: Callable, saves: str = "") -> Tensor:
    """``saves``: what the backward reads, as torch saves it: "a" / "b" for ``a``'s / ``b``'s
    values read for the other side's gradient (d(a*b)/da reads b), "A" / "B" for ``a``'s /
    ``b``'s values read for both, "o" for the output; a write into any of them before the
    backward raises (``versions``)."""
    bd, bt = operand(b, a)
    ad = a.array
    bfloat16 = involves_bfloat16(ad, bd)
    if bfloat16:  # NumPy promotes bfloat16 otherwise than torch (see bfloat16.py)
        ad, bd = promote_operands(ad, bd)
    try:
        out = forward(ad, bd)
    except ValueError:
        raise broadcast_error(op, ad, bd) from None
    if bfloat16:
        out = round_like(out, ad, bd)
    need_a = a.requires_grad
    need_b = bt is not None and bt.requires_grad
    if not ((need_a or need_b) and GRAD_MODE.enabled):
        return _constant(out)
    a_shape, b_shape = ad.shape, _shape(bd)
    checks = _saved_checks(saves, ad, a, bt if need_a or "B" in saves else None,
                           a if need_b or "A" in saves else None, out) if saves else ()
    out_counter = checks[-1][1] if checks and "o" in saves else None

    def backward(g: Any) -> tuple:
        for array, counter, version in checks:
            if counter[0] != version:
                raise modified_error(f"{op.capitalize()}Backward", array, counter, version)
        ga = unbroadcast(grad_a(g, ad, bd, out), a_shape) if need_a else None
        if bt is None:
            return (ga,)
        return ga, (unbroadcast(grad_b(g, ad, bd, out), b_shape) if need_b else None)

    return _node(out, (a,) if bt is None else (a, bt), backward, out_counter)


def _saved_checks(saves: str, ad: Any, a: Tensor, b_needed: Optional[Tensor],
                  a_needed: Optional[Tensor], out: Any) -> tuple:
    """(array, counter, version) of each tensor the backward will read; the output's last."""
    checks = []
    if ("a" in saves or "A" in saves) and a_needed is not None:
        checks.append((ad, a._vc, a._vc[0]))
    if ("b" in saves or "B" in saves) and b_needed is not None:
        checks.append((b_needed.array, b_needed._vc, b_needed._vc[0]))
    if "o" in saves:
        checks.append((out, [0], 0))
    return tuple(checks)


def _pass(g: Any, x: Any, y: Any, out: Any) -> Any:
    return g


def _negate(g: Any, x: Any, y: Any, out: Any) -> Any:
    return -g


def add(a: Tensor, b: Any) -> Tensor:
    return _binary("add", a, b, lambda x, y: x + y, _pass, _pass)


def sub(a: Tensor, b: Any) -> Tensor:
    return _binary("sub", a, b, lambda x, y: x - y, _pass, _negate)


def rsub(a: Tensor, b: Any) -> Tensor:
    return _binary("sub", a, b, lambda x, y: y - x, _negate, _pass)


def mul(a: Tensor, b: Any) -> Tensor:
    return _binary("mul", a, b, lambda x, y: x * y,
                   lambda g, x, y, out: g * y, lambda g, x, y, out: g * x, saves="ab")


def div(a: Tensor, b: Any) -> Tensor:
    return _binary("div", a, b, lambda x, y: x / y,
                   lambda g, x, y, out: g / y, lambda g, x, y, out: -g * out / y, saves="B")


def rdiv(a: Tensor, b: Any) -> Tensor:
    return _binary("div", a, b, lambda x, y: y / x,
                   lambda g, x, y, out: -g * out / x, lambda g, x, y, out: g / x)


def _safe_log(x: Any) -> Any:
    # d(x**y)/dy = x**y * log(x); where x == 0 the product is taken as 0 (as PyTorch does).
    xp = xp_of(x)
    return xp.log(xp.where(x == 0, 1, x))


def _pow_grad_base(g: Any, x: Any, y: Any, out: Any) -> Any:
    if isinstance(y, _PY_SCALARS):
        if y == 0:  # x**0 is constant; avoid 0 * inf at x == 0
            return xp_of(g).zeros_like(g)
        return g * (2 * x) if y == 2 else g * (y * x ** (y - 1))
    xp = xp_of(x)
    return xp.where(y == 0, 0, g * y * x ** (y - 1))


def pow(a: Tensor, b: Any) -> Tensor:
    # as torch: the base is saved ("A": read for both sides), and with a tensor exponent
    # also the exponent and the output
    return _binary("pow", a, b, lambda x, y: x ** y, _pow_grad_base,
                   lambda g, x, y, out: g * out * _safe_log(x),
                   saves="ABo" if isinstance(b, Tensor) else "A")


def rpow(a: Tensor, b: Any) -> Tensor:
    return _binary("pow", a, b, lambda x, y: y ** x,
                   lambda g, x, y, out: g * out * _safe_log(xp_of(x).asarray(y)),
                   lambda g, x, y, out: g * x * y ** (x - 1), saves="Ao")


def _unary(x: Tensor, out: Any, grad: Callable[[Any], Any], saves: str = "",
           op: str = "") -> Tensor:
    """``saves``: "x" when ``grad`` reads the input's values, "o" the output's (checked
    against in-place writes before the backward, as torch)."""
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(out)
    if not saves:
        return _node(out, (x,), lambda g: (grad(g),))
    array, counter = (x.array, x._vc) if saves == "x" else (out, [0])
    version = counter[0]

    def backward(g: Any) -> tuple:
        if counter[0] != version:
            raise modified_error(f"{op}Backward", array, counter, version)
        return (grad(g),)

    return _node(out, (x,), backward, counter if saves == "o" else None)


def neg(x: Tensor) -> Tensor:
    return _unary(x, -x.array, lambda g: -g)


def exp(x: Tensor) -> Tensor:
    out = xp_of(x.array).exp(x.array)
    return _unary(x, out, lambda g: g * out, "o", "Exp")


def log(x: Tensor) -> Tensor:
    xd = x.array
    return _unary(x, xp_of(xd).log(xd), lambda g: g / xd, "x", "Log")


def tanh(x: Tensor) -> Tensor:
    out = xp_of(x.array).tanh(x.array)
    return _unary(x, out, lambda g: g * (1 - out * out), "o", "Tanh")


def sqrt(x: Tensor) -> Tensor:
    out = xp_of(x.array).sqrt(x.array)
    return _unary(x, out, lambda g: g * 0.5 / out, "o", "Sqrt")


def relu(x: Tensor) -> Tensor:
    from .fused_activations import relu as compiled_relu  # it imports this module
    return compiled_relu(x)


def sigmoid(x: Tensor) -> Tensor:
    xd = x.array
    xp = xp_of(xd)
    e = xp.exp(-xp.abs(xd))  # never overflows
    out = xp.where(xd >= 0, 1 / (1 + e), e / (1 + e))
    return _unary(x, out, lambda g: g * out * (1 - out), "o", "Sigmoid")


def abs(x: Tensor) -> Tensor:
    xd = x.array
    xp = xp_of(xd)
    return _unary(x, xp.abs(xd), lambda g: g * xp.sign(xd), "x", "Abs")


def clip(x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    """Clamp into [min, max]; the gradient flows where the input was inside the range."""
    if min is None and max is None:
        raise ValueError("clip needs at least one of min and max")
    xd = x.array
    lo = min.array if isinstance(min, Tensor) else min
    hi = max.array if isinstance(max, Tensor) else max
    out = round_like(xp_of(xd).clip(xd, lo, hi), xd, lo, hi)  # bfloat16 stays bfloat16

    def grad(g: Any) -> Any:
        inside = True
        if lo is not None:
            inside = xd >= lo
        if hi is not None:
            inside = inside & (xd <= hi)
        return g * inside

    return _unary(x, out, grad, "x", "Clamp")


def _compare(op: str, fn: Callable) -> Callable:
    def compare(a: Tensor, b: Any) -> Tensor:
        bd, _ = operand(b, a)
        try:
            return _constant(fn(a.array, bd))
        except ValueError:
            raise broadcast_error(op, a.array, bd) from None
    compare.__name__ = op
    return compare


lt = _compare("lt", lambda x, y: x < y)
le = _compare("le", lambda x, y: x <= y)
gt = _compare("gt", lambda x, y: x > y)
ge = _compare("ge", lambda x, y: x >= y)
eq = _compare("eq", lambda x, y: x == y)
ne = _compare("ne", lambda x, y: x != y)
logical_and = _compare("logical_and", lambda x, y: x & y)
logical_or = _compare("logical_or", lambda x, y: x | y)
logical_xor = _compare("logical_xor", lambda x, y: x ^ y)


def logical_not(x: Tensor) -> Tensor:
    return _constant(~x.array)
