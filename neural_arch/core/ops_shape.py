"""Shape operations, indexing, joining and selection (views where NumPy gives views)."""
from __future__ import annotations

from typing import Any, Sequence, Tuple

from ..backends import xp_of
from .bfloat16 import round_like
from .broadcast import unbroadcast
from .grad_mode import GRAD_MODE
from .ops_elementwise import broadcast_error, operand
from .tensor import Tensor, _constant, _node
from .versions import share_counter


def _shape_args(shape: tuple) -> Tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(n) for n in shape)


def _unary(x: Tensor, out: Any, grad: Any) -> Tensor:
    if x.requires_grad and GRAD_MODE.enabled:
        result = _node(out, (x,), lambda g: (grad(g),))
    else:
        result = _constant(out)
    return _counted_as_view(result, x)


def _counted_as_view(result: Tensor, x: Tensor) -> Tensor:
    """A result over ``x``'s memory (NumPy gave a view) shares ``x``'s version counter."""
    out = result.array
    if out.base is not None and xp_of(out).may_share_memory(out, x.array):
        share_counter(result, x)
    return result


def reshape(x: Tensor, *shape: Any) -> Tensor:
    """Reshape to ``shape`` (a tuple or several ints; one entry may be -1)."""
    shape = _shape_args(shape)
    in_shape = x.array.shape
    try:
        out = x.array.reshape(shape)
    except ValueError:
        raise ValueError(f"cannot reshape tensor of shape {in_shape} (size {x.array.size}) "
                         f"into shape {shape}") from None
    return _unary(x, out, lambda g: g.reshape(in_shape))


def _permute(x: Tensor, perm: Tuple[int, ...]) -> Tensor:
    ndim = x.array.ndim
    if sorted(p % ndim for p in perm) != list(range(ndim)) or len(perm) != ndim:
        raise ValueError(f"axes {perm} are not a permutation of the {ndim} dimensions of a "
                         f"tensor of shape {x.array.shape}")
    perm = tuple(p % ndim for p in perm)
    inverse = tuple(sorted(range(ndim), key=perm.__getitem__))
    return _unary(x, x.array.transpose(perm), lambda g: g.transpose(inverse))


def permute(x: Tensor, *dims: Any) -> Tensor:
    """Reorder the dimensions: ``out.shape[i] == x.shape[dims[i]]``."""
    return _permute(x, _shape_args(dims))


def transpose(x: Tensor, *axes: Any) -> Tensor:
    """No arguments: reverse the axes. Two axes: swap them (PyTorch). Otherwise a permutation."""
    axes = _shape_args(axes) if axes else ()
    ndim = x.array.ndim
    if not axes:
        return _permute(x, tuple(reversed(range(ndim))))
    if len(axes) == 2:
        first, second = axes
        for a in axes:
            if not -ndim <= a < ndim:
                raise ValueError(f"axis {a} is out of range for shape {x.array.shape}")
        perm = list(range(ndim))
        perm[first], perm[second] = perm[second], perm[first]
        return _permute(x, tuple(perm))
    return _permute(x, axes)


def swapaxes(x: Tensor, axis1: int, axis2: int) -> Tensor:
    return transpose(x, axis1, axis2)


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """Insert a size-1 dimension at ``dim`` (``-ndim-1 <= dim <= ndim``)."""
    ndim = x.array.ndim
    if not -ndim - 1 <= dim <= ndim:
        raise ValueError(f"unsqueeze dim {dim} is out of range for shape {x.array.shape}")
    in_shape = x.array.shape
    out = xp_of(x.array).expand_dims(x.array, dim % (ndim + 1))
    return _unary(x, out, lambda g: g.reshape(in_shape))


def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    """Drop size-1 dimensions (all, or only ``dim``; a ``dim`` of size > 1 is left alone)."""
    shape = x.array.shape
    if dim is None:
        dims = tuple(i for i, n in enumerate(shape) if n == 1)
    else:
        requested = dim if isinstance(dim, (tuple, list)) else (dim,)
        for d in requested:
            if not -len(shape) <= d < max(len(shape), 1):
                raise ValueError(f"squeeze dim {d} is out of range for shape {shape}")
        dims = tuple(d % len(shape) for d in requested if shape[d] == 1) if shape else ()
    out = x.array.reshape(tuple(n for i, n in enumerate(shape) if i not in dims))
    return _unary(x, out, lambda g: g.reshape(shape))


def expand(x: Tensor, *shape: Any) -> Tensor:
    """Broadcast to ``shape`` without copying; -1 keeps a dimension's size."""
    shape = _shape_args(shape)
    in_shape = x.array.shape
    offset = len(shape) - len(in_shape)
    if offset < 0:
        raise ValueError(f"cannot expand shape {in_shape} to fewer dimensions {shape}")
    target = tuple(in_shape[i - offset] if n == -1 and i >= offset else n
                   for i, n in enumerate(shape))
    try:
        out = xp_of(x.array).broadcast_to(x.array, target)
    except ValueError:
        raise ValueError(f"cannot expand shape {in_shape} to shape {target}") from None
    return _unary(x, out, lambda g: unbroadcast(g, in_shape))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge dimensions ``start_dim..end_dim`` (inclusive) into one."""
    shape = x.array.shape
    if not shape:
        return reshape(x, (1,))
    start, end = start_dim % len(shape), end_dim % len(shape)
    if start > end:
        raise ValueError(f"flatten start_dim {start_dim} comes after end_dim {end_dim} "
                         f"for shape {shape}")
    merged = 1
    for n in shape[start:end + 1]:
        merged *= n
    return reshape(x, shape[:start] + (merged,) + shape[end + 1:])


def _plain_index(index: Any) -> Any:
    if isinstance(index, Tensor):
        return index.array
    if isinstance(index, tuple):
        return tuple(i.array if isinstance(i, Tensor) else i for i in index)
    return index


def _is_basic(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if part is None or part is Ellipsis or isinstance(part, slice):
            continue
        if isinstance(part, int) and not isinstance(part, bool):
            continue
        return False
    return True


def _is_single_mask(index: Any) -> bool:
    return getattr(index, "dtype", None) is not None and index.dtype.kind == "b"


def index_add(xp: Any, target: Any, index: Any, values: Any) -> None:
    """``target[index] += values`` with repeated indices accumulating (``np.add.at``)."""
    at = getattr(xp.add, "at", None)
    if at is not None:
        at(target, index, values)
    else:
        import cupyx  # CuPy builds without ufunc.at provide scatter_add instead

        cupyx.scatter_add(target, index, values)


def getitem(x: Tensor, index: Any) -> Tensor:
    """Indexing as in NumPy; repeated integer indices accumulate their gradients."""
    index = _plain_index(index)
    xd = x.array
    out = xd[index]
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _counted_as_view(_constant(out), x)
    in_shape = xd.shape
    assign = _is_basic(index) or _is_single_mask(index)

    def backward(g: Any) -> tuple:
        xp = xp_of(g)
        grad = xp.zeros(in_shape, dtype=g.dtype)
        if assign:
            grad[index] = g
        else:
            index_add(xp, grad, index, g)
        return (grad,)

    return _counted_as_view(_node(out, (x,), backward), x)


def _as_tensors(tensors: Sequence[Any], op: str) -> list:
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise ValueError(f"{op} needs a non-empty list of tensors, got {tensors!r}")
    return [t if isinstance(t, Tensor) else Tensor(t) for t in tensors]


def _join(tensors: Sequence[Any], axis: int, op: str, stacked: bool) -> Tensor:
    parts = _as_tensors(tensors, op)
    xp = xp_of(parts[0].array)
    arrays = [t.array for t in parts]
    try:
        out = xp.stack(arrays, axis=axis) if stacked else xp.concatenate(arrays, axis=axis)
    except ValueError as exc:
        shapes = [tuple(a.shape) for a in arrays]
        raise ValueError(f"{op} along axis {axis}: incompatible shapes {shapes} ({exc})") from None
    if not (GRAD_MODE.enabled and any(t.requires_grad for t in parts)):
        return _constant(out)
    ax = axis % out.ndim
    if stacked:
        def backward(g: Any) -> tuple:
            prefix = (slice(None),) * ax
            return tuple(g[prefix + (i,)] if t.requires_grad else None
                         for i, t in enumerate(parts))
    else:
        bounds = []
        start = 0
        for a in arrays:
            bounds.append((start, start + a.shape[ax]))
            start += a.shape[ax]

        def backward(g: Any) -> tuple:
            prefix = (slice(None),) * ax
            return tuple(g[prefix + (slice(lo, hi),)] if t.requires_grad else None
                         for (lo, hi), t in zip(bounds, parts))
    return _node(out, tuple(parts), backward)


def concatenate(tensors: Sequence[Any], axis: int = 0, dim: Any = None) -> Tensor:
    """Join tensors along an existing axis (``cat`` is an alias)."""
    return _join(tensors, axis if dim is None else dim, "concatenate", stacked=False)


def stack(tensors: Sequence[Any], axis: int = 0, dim: Any = None) -> Tensor:
    """Join equally shaped tensors along a new axis."""
    return _join(tensors, axis if dim is None else dim, "stack", stacked=True)


def where(condition: Any, a: Any, b: Any) -> Tensor:
    """Elements of ``a`` where ``condition`` holds, else of ``b`` (either may be a scalar)."""
    cond = condition.array if isinstance(condition, Tensor) else condition
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else Tensor(0.0)
    ad, at = operand(a, like)
    bd, bt = operand(b, like)
    xp = xp_of(like.array)
    try:
        out = xp.where(cond, ad, bd)
    except ValueError:
        shapes = [tuple(getattr(v, "shape", ())) for v in (cond, ad, bd)]
        raise ValueError(f"where: cannot broadcast condition/a/b shapes {shapes}") from None
    out = round_like(out, ad, bd)  # bfloat16 beside a Python number stays bfloat16
    need_a = at is not None and at.requires_grad
    need_b = bt is not None and bt.requires_grad
    if not ((need_a or need_b) and GRAD_MODE.enabled):
        return _constant(out)
    parents = tuple(t for t in (at, bt) if t is not None)

    def backward(g: Any) -> tuple:
        grads = []
        if at is not None:
            grads.append(unbroadcast(xp.where(cond, g, 0), ad.shape) if need_a else None)
        if bt is not None:
            grads.append(unbroadcast(xp.where(cond, 0, g), bd.shape) if need_b else None)
        return tuple(grads)

    return _node(out, parents, backward)


def masked_fill(x: Tensor, mask: Any, value: Any) -> Tensor:
    """``x`` with ``value`` written where ``mask`` is True (no gradient flows there)."""
    maskd = mask.array if isinstance(mask, Tensor) else mask
    fill = value.array if isinstance(value, Tensor) else value
    xd = x.array
    xp = xp_of(xd)
    try:
        out = xp.where(maskd, xp.asarray(fill, dtype=xd.dtype), xd)
    except ValueError:
        raise broadcast_error("masked_fill", xd, maskd) from None
    in_shape = xd.shape
    return _unary(x, out, lambda g: unbroadcast(xp.where(maskd, 0, g), in_shape))
