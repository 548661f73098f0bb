"""``Module.to`` in torch's forms, and the casts ``half`` / ``float`` / ``double`` / ``bfloat16`` /
``type`` and the moves ``cpu`` / ``cuda``.

As in torch, a module is converted in place: each parameter gets a new array but stays the
same object (torch replaces ``.data``), so an optimizer built before the call still holds the
model's parameters; gradients are converted with their parameters. ``to`` and the named casts
change floating parameters and buffers only (an integer buffer such as BatchNorm's
``num_batches_tracked`` keeps its dtype); ``type`` converts everything, as torch's does.
``to(memory_format=)`` lays out the 4-D and 5-D parameters, gradients and buffers in that
format, as torch's does (``core.torch_memory_format``: strides, values unchanged).
Every argument is checked before anything changes, so a refused call leaves the module whole.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ..backends import device_type, get_backend
from ..core import Tensor
from ..core import torch_memory_format as formats
from ..core.dtypes import is_floating, resolve_dtype

# array -> converted array (or the same array when nothing changes)
Convert = Callable[[Any], Any]

_TO_FORMS = ("to(device=None, dtype=None, non_blocking=False, *, memory_format=None), "
             "to(dtype, non_blocking=False, *, memory_format=None) "
             "or to(tensor, non_blocking=False, *, memory_format=None)")


def _is_device(value: Any) -> bool:
    # Strings and ints are devices ("cpu", "cuda:1", a device object, a local rank), as in
    # Tensor.to; anything else in the first place is a dtype.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def parse_to_arguments(args: Tuple[Any, ...], kwargs: dict) -> Tuple[Any, Any]:
    """(device, dtype) from the arguments of ``Module.to``, each None when not asked for."""
    unknown = sorted(set(kwargs) - {"device", "dtype", "non_blocking"})
    if unknown:
        raise TypeError(f"to() got unexpected keyword arguments {unknown}; it takes {_TO_FORMS}")
    given = dict(kwargs)
    if args and isinstance(args[0], Tensor):
        names: Tuple[str, ...] = ("tensor", "non_blocking")
    elif args and _is_device(args[0]):
        names = ("device", "dtype", "non_blocking")
    else:
        names = ("dtype", "non_blocking")
    if len(args) > len(names):
        raise TypeError(f"to() got {len(args)} positional arguments "
                        f"({', '.join(type(a).__name__ for a in args)}); it takes {_TO_FORMS}")
    for name, value in zip(names, args):
        if name in given:
            raise TypeError(f"to() got multiple values for argument '{name}'")
        given[name] = value
    non_blocking = given.get("non_blocking", False)
    if not isinstance(non_blocking, bool):
        raise TypeError(f"to(): non_blocking must be a bool, got {type(non_blocking).__name__} "
                        f"{non_blocking!r}")
    tensor = given.get("tensor")
    if tensor is not None:
        return tensor.device, tensor.dtype
    return given.get("device"), given.get("dtype")


def checked_device(device: Any) -> Optional[str]:
    """``device`` when it can be used here (the GPU backend present for "cuda"); None stays
    None. Raises before any array moves."""
    if device is None:
        return None
    if device_type(device) == "cuda":
        get_backend("cupy").require()
    return device


def converter(device: Any = None, dtype: Any = None, memory_format: Any = None) -> Convert:
    """array -> the array on ``device`` (None: where it is) cast to ``dtype`` (None: its own),
    laid out in ``memory_format`` when it has 4 or 5 dimensions (None: as it is)."""
    target = None if dtype is None else resolve_dtype(dtype)

    def convert(array: Any) -> Any:
        if target is not None and array.dtype != target:
            array = array.astype(target)
        if device is not None:
            array = Tensor(array, dtype=array.dtype, device=device).array
        if memory_format is not None and array.ndim in (4, 5):
            array = formats.in_format(array, memory_format, "Module.to")
        return array
    return convert


def _checked_layouts(module: Any, memory_format: Any) -> None:
    """torch's rank error for a 5-D tensor asked for ``channels_last`` (or a 4-D one for
    ``channels_last_3d``), raised before anything is converted."""
    for owner in module.modules():
        for value in list(owner._parameters.values()) + list(owner._buffers.values()):
            shape = getattr(value, "shape", ())
            if len(shape) in (4, 5):
                formats.check_rank(tuple(shape), memory_format, "Module.to")


def convert_module(module: Any, floating: Convert, other: Optional[Convert] = None) -> None:
    """Apply ``floating`` to every floating parameter, gradient and buffer of ``module`` and its
    submodules, ``other`` (None: leave them) to the rest. Parameters and Tensor buffers keep
    their identity; array buffers are replaced."""
    def convert(array: Any) -> Any:
        chosen = floating if is_floating(array.dtype) else other
        return array if chosen is None else chosen(array)

    for owner in module.modules():
        for param in owner._parameters.values():
            if param is None:
                continue
            param.array = convert(param.array)
            if param.grad is not None:  # the gradient tensor is converted in place, as torch does
                param.grad.array = convert(param.grad.array)
        for name, buf in owner._buffers.items():
            if isinstance(buf, Tensor):
                buf.array = convert(buf.array)
            elif hasattr(buf, "dtype") and hasattr(buf, "shape"):
                owner._store(owner._buffers, name, convert(buf))


class ModuleCasting:
    """The device and dtype conversions of ``Module`` (a base of it)."""

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)`` (its device and
        dtype), with the keywords ``device=``, ``dtype=`` and ``non_blocking=`` (accepted; the
        copies here are synchronous). Moves every parameter and buffer to the device and casts
        the floating ones to the dtype, which must be floating; ``memory_format=`` (keyword
        only) lays out every 4-D and 5-D tensor in that format; returns self."""
        kwargs = dict(kwargs)
        layout = kwargs.pop("memory_format", None)
        if layout is not None:
            layout = formats.checked_format(layout, "to")
            if layout is not formats.preserve_format:
                _checked_layouts(self, layout)
        device, dtype = parse_to_arguments(args, kwargs)
        if dtype is not None:
            target = resolve_dtype(dtype)
            if not is_floating(target):
                raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got "
                                f"desired dtype={target}")
        device = checked_device(device)
        if layout is formats.preserve_format:
            layout = None
        if device is None and dtype is None and layout is None:
            return self
        move = converter(device, memory_format=layout)
        convert_module(self, converter(device, dtype, layout),
                       move if device is not None or layout is not None else None)
        return self

    def cpu(self) -> Any:
        """Move every parameter and buffer to the CPU; returns self."""
        return self.to("cpu")

    def cuda(self, device: Any = None) -> Any:
        """Move every parameter and buffer to the GPU (``device``: an index or "cuda:N");
        returns self."""
        return self.to("cuda" if device is None else
                       f"cuda:{device}" if isinstance(device, int) else device)

    def _cast_floating(self, dtype: Any) -> Any:
        convert_module(self, converter(dtype=dtype))
        return self

    def half(self) -> Any:
        """Cast floating parameters and buffers to float16; returns self."""
        return self._cast_floating("float16")

    def double(self) -> Any:
        """Cast floating parameters and buffers to float64; returns self."""
        return self._cast_floating("float64")

    def bfloat16(self) -> Any:
        """Cast floating parameters and buffers to bfloat16 (needs ``ml_dtypes``, the extra
        ``neural-arch[bfloat16]``); returns self."""
        return self._cast_floating("bfloat16")

    # Last: these names shadow the builtins in the rest of the class body.
    def float(self) -> Any:
        """Cast floating parameters and buffers to float32; returns self."""
        return self._cast_floating("float32")

    def type(self, dst_type: Any) -> Any:
        """Cast every parameter and buffer, integer buffers included (as torch's ``type``),
        to ``dst_type``; returns self. A parameter that requires grad cannot become integer."""
        target = resolve_dtype(dst_type)
        if not is_floating(target):
            for name, param in self.named_parameters():
                if param.requires_grad:
                    raise RuntimeError(f"type({target}): parameter {name!r} requires grad, "
                                       f"which only floating point tensors can")
        cast = converter(dtype=target)
        convert_module(self, cast, cast)
        return self
