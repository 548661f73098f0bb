"""``einsum`` with gradients: NumPy's einsum forward; each operand's gradient is itself an
einsum of the output gradient with the other operands.

The equation is first rewritten without ``...`` and with an explicit output, so that the
backward can name every dimension by a letter. Two cases need more than one einsum: a letter
that appears only in the operand being differentiated (summed away in the forward) gets the
gradient broadcast along it, and a letter repeated within one operand (a diagonal, ``"ii->i"``)
gets the gradient written onto that diagonal. Size-1 dimensions broadcast against larger ones as
in torch; their gradients are summed back.
"""
from __future__ import annotations

import string
from typing import Any, List, Sequence, Tuple

from ..backends import xp_of
from .autocast_state import autocast_inputs
from .bfloat16_compute import computes_bfloat16_in_float32
from .tensor import Tensor, make_result


def _split(equation: str, ndims: Sequence[int]) -> Tuple[List[str], str]:
    """(one subscript string per operand, output subscripts), ``...`` replaced by letters."""
    equation = equation.replace(" ", "")
    inputs_text, arrow, output = equation.partition("->")
    inputs = inputs_text.split(",")
    if len(inputs) != len(ndims):
        raise ValueError(f"einsum: equation {equation!r} names {len(inputs)} operands, got "
                         f"{len(ndims)}")
    used = set(equation) - set(".,->")
    spare = [c for c in string.ascii_letters if c not in used]
    widest = 0
    for subs, ndim in zip(inputs, ndims):
        named = len(subs.replace("...", ""))
        if ("..." in subs and named > ndim) or ("..." not in subs and named != ndim):
            raise ValueError(f"einsum: subscripts {subs!r} do not fit an operand with {ndim} "
                             f"dimensions (equation {equation!r})")
        if "..." in subs:
            widest = max(widest, ndim - named)
    ellipsis = "".join(spare[:widest])
    expanded = []
    for subs, ndim in zip(inputs, ndims):
        if "..." in subs:
            width = ndim - len(subs.replace("...", ""))
            subs = subs.replace("...", ellipsis[widest - width:])
        expanded.append(subs)
    if arrow:
        output = output.replace("...", ellipsis)
    else:  # implicit output: the broadcast dimensions, then letters used once, sorted
        letters = "".join(inputs).replace("...", "")
        output = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for c in output:
        if c not in "".join(expanded):
            raise ValueError(f"einsum: output subscript {c!r} appears in no operand "
                             f"(equation {equation!r})")
    return expanded, output


def _operand_grad(g: Any, output: str, subs: List[str], arrays: List[Any], i: int) -> Any:
    """d(loss)/d(operand i) given ``g`` = d(loss)/d(output)."""
    xp = xp_of(g)
    target = arrays[i]
    mine = subs[i]
    others = [s for j, s in enumerate(subs) if j != i]
    available = set(output).union(*others) if others else set(output)
    unique = "".join(dict.fromkeys(mine))
    computed = "".join(c for c in unique if c in available)
    terms = ",".join([output] + others)
    part = xp.einsum(f"{terms}->{computed}", g, *(a for j, a in enumerate(arrays) if j != i))
    # sizes each letter has in this operand
    size = {c: n for c, n in zip(mine, target.shape)}
    for axis, c in enumerate(unique):
        if c not in available:
            part = xp.expand_dims(part, axis)
    part = xp.broadcast_to(part, tuple(max(size[c], part.shape[a])
                                       for a, c in enumerate(unique)))
    # a size-1 dimension that broadcast against a larger one gets the sum
    summed = tuple(a for a, c in enumerate(unique) if size[c] == 1 and part.shape[a] != 1)
    if summed:
        part = part.sum(axis=summed, keepdims=True)
    if len(unique) == len(mine):
        return xp.ascontiguousarray(part.transpose([unique.index(c) for c in mine]))
    grad = xp.zeros(target.shape, dtype=g.dtype)
    # a diagonal: write into the places where the repeated letters take the same value
    grids = xp.indices(part.shape, sparse=True)
    grad[tuple(grids[unique.index(c)] for c in mine)] = part
    return grad


def einsum(equation: str, *operands: Any) -> Tensor:
    """``einsum("ij,jk->ik", a, b)`` (or the operands as one list), differentiable in each."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return _einsum(equation, *(t if isinstance(t, Tensor) else Tensor(t) for t in operands))


@computes_bfloat16_in_float32("einsum")
def _einsum(equation: str, *tensors: Tensor) -> Tensor:
    tensors = autocast_inputs("einsum", *tensors)  # torch's einsum runs as bmm under autocast
    arrays = [t.array for t in tensors]
    subs, output = _split(equation, [a.ndim for a in arrays])
    explicit = f"{','.join(subs)}->{output}"
    try:
        out = xp_of(arrays[0]).einsum(explicit, *arrays)
    except ValueError as exc:
        shapes = [tuple(a.shape) for a in arrays]
        raise ValueError(f"einsum {equation!r} on shapes {shapes}: {exc}") from None

    def backward(g: Any) -> tuple:
        return tuple(_operand_grad(g, output, subs, arrays, i) if t.requires_grad else None
                     for i, t in enumerate(tensors))

    return make_result(out, tensors, backward)
