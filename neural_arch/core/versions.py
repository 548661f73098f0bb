"""Version counters, as torch keeps them: every tensor's ``_version`` counts the in-place
writes into its data, and an op that saves a tensor for its backward records that count so the
backward can refuse to use values that were overwritten since.

A counter is a one-element list shared by the tensors that alias one array through the
framework: a tensor, its ``detach()``, the entries of a module's ``state_dict()`` and the views
the shape ops return. An op records ``(counter, counter[0])`` when it saves a tensor and
compares before its backward uses the array: one list read per saved tensor, no copies.
"""
from __future__ import annotations

from typing import Any, List

_TORCH_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor",
                     "float16": "HalfTensor", "bfloat16": "BFloat16Tensor",
                     "int64": "LongTensor", "int32": "IntTensor", "int16": "ShortTensor",
                     "int8": "CharTensor", "uint8": "ByteTensor", "bool": "BoolTensor"}
_HINT = ("Hint: the backtrace further above shows the operation that failed to compute its "
         "gradient; write into a clone() of the tensor instead, or do the write after "
         "backward().")


def modified_error(op: str, array: Any, counter: List[int], expected: int) -> RuntimeError:
    """torch's error for a tensor saved by ``op`` and overwritten in place since."""
    kind = _TORCH_TYPE_NAMES.get(str(array.dtype), f"{array.dtype} tensor")
    return RuntimeError(
        f"one of the variables needed for gradient computation has been modified by an "
        f"inplace operation: [torch.{kind} {list(array.shape)}], which is saved by {op}, is "
        f"at version {counter[0]}; expected version {expected} instead. {_HINT}")


def saved_entry(tensor: Any) -> tuple:
    """What an op records when it saves ``tensor``: (array, counter, version now)."""
    counter = tensor._vc
    return tensor.array, counter, counter[0]


def check_saved(op: str, entries: tuple) -> None:
    """Raise torch's error if a tensor in ``entries`` (``saved_entry``'s) was written since."""
    for array, counter, expected in entries:
        if counter[0] != expected:
            raise modified_error(op, array, counter, expected)


def share_counter(view: Any, base: Any) -> Any:
    """Make ``view`` (an op output over ``base``'s memory) count ``base``'s in-place writes
    and ``base`` count its, as torch's views do; returns ``view``. The counter gets a second
    element, the mark of a storage with views (see ``tensor_inplace``)."""
    counter = base._vc
    if len(counter) == 1:
        counter.append(True)  # marks a storage with views: in-place writes are not recorded
    view._vc = counter
    return view
