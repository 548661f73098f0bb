"""Fused CUDA kernels on CuPy arrays: bias+GELU, softmax cross-entropy, LayerNorm, multi-tensor
AdamW and fp16/fp32 gradient unscaling.

The sources live in ``neural_arch/backends/kernels/*.cu`` and are compiled with
``cupy.RawModule`` on first use (once per source file and device). Every function here has the
signature of its float64 definition in ``neural_arch.backends.kernels.reference``; the kernels
compute in float32 (the unscale kernel also takes float16). Importing this module never needs
CuPy; calling a kernel without CuPy or a GPU raises RuntimeError saying why.

Only arrays come in and out. The autograd-aware forms for tensors (``fused_bias_gelu``,
``fused_cross_entropy``, ``fused_layer_norm``) are in ``neural_arch.core.fused_kernels`` and the
``FusedAdamW`` optimizer in ``neural_arch.optim.fused_adamw``: they sit above the backends and
call these functions.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Dict, Optional, Sequence, Tuple

from . import cupy_backend
from .kernels import KERNELS, kernels_in, multi_tensor, pack_args, source, validate

_THREADS = 256
_MAX_GRID_STRIDE_BLOCKS = 1 << 16
_functions: Dict[Tuple[str, int], Any] = {}
_constants: Dict[Tuple[str, int, int], Any] = {}
_chunk_tables: Dict[Tuple[Tuple[int, ...], int], Tuple[Any, Any, Any]] = {}
_MAX_CACHED_TABLES = 16
_pointer_tables: Dict[Tuple[bytes, int], Any] = {}
_dtype_names: Dict[Any, str] = {}
_lock = threading.Lock()
_GELU_KERNELS = {
    ("none", "forward"): "bias_gelu_erf_forward", ("tanh", "forward"): "bias_gelu_tanh_forward",
    ("none", "backward"): "bias_gelu_erf_backward",
    ("tanh", "backward"): "bias_gelu_tanh_backward",
}
_UNSCALE_KERNELS = {"float16": "unscale_check_inf_f16", "float32": "unscale_check_inf_f32"}


def is_available() -> bool:
    """True when CuPy imports and a CUDA device answers."""
    return cupy_backend.is_available()


def _cp() -> Any:
    return cupy_backend.require()


def launch(name: str, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...]) -> None:
    """Run kernel ``name`` from the kernel table on the current device and stream."""
    packed = pack_args(name, args)  # validates the name and the argument types first
    cp = _cp()
    key = (name, cp.cuda.Device().id)
    function = _functions.get(key)
    if function is None:
        with _lock:
            if key not in _functions:
                module = cp.RawModule(code=source(KERNELS[name].source))
                for other in kernels_in(KERNELS[name].source):
                    _functions[(other, key[1])] = module.get_function(other)
            function = _functions[key]
    function(grid, block, packed)


def dtype_name(dtype: Any) -> str:
    """``dtype.name``, remembered: NumPy computes the name in Python, microseconds a call, and a
    multi-tensor launch checks four arrays per tensor."""
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = dtype.name
    return name


def _device_array(op: str, what: str, array: Any, dtypes: Tuple[str, ...] = ("float32",),
                  contiguous: bool = False) -> Any:
    """``array`` as a C-contiguous CuPy array (copied if needed, unless ``contiguous`` demands
    it already is because the kernel writes into it)."""
    cp = _cp()
    if not isinstance(array, cp.ndarray):
        raise TypeError(f"{op}: {what} must be a CuPy array, got {type(array).__name__}")
    if dtype_name(array.dtype) not in dtypes:
        raise TypeError(f"{op}: {what} has dtype {array.dtype}; this kernel takes {dtypes}")
    # CuPy's public flags build an object per read (~0.5 us); its _c_contiguous field is the
    # same bit, and a multi-tensor launch reads it for four arrays per tensor
    c_contiguous = getattr(array, "_c_contiguous", None)
    if c_contiguous if c_contiguous is not None else array.flags.c_contiguous:
        return array
    if contiguous:
        raise ValueError(f"{op}: {what} (shape {array.shape}, strides {array.strides}) is "
                         "updated in place and must be C-contiguous")
    return cp.ascontiguousarray(array)


def _filled(value: float, size: int) -> Any:
    """A cached read-only-by-convention float32 vector of ``size`` copies of ``value``."""
    cp = _cp()
    key = (str(value), size, cp.cuda.Device().id)
    array = _constants.get(key)
    if array is None:
        if len(_constants) >= _MAX_CACHED_TABLES:  # shapes that keep changing must not pile up
            _constants.clear()
        array = _constants[key] = cp.full(size, value, dtype=cp.float32)
    return array


def _grid_stride_blocks(n: int) -> int:
    return max(1, min(-(-n // _THREADS), _MAX_GRID_STRIDE_BLOCKS))


def _row_threads(width: int) -> int:
    """Threads per row block: enough warps to cover ``width`` up to 256, at least one warp."""
    return min(_THREADS, max(32, -(-width // 32) * 32))


def _int32(op: str, what: str, value: int) -> int:
    if value > 2 ** 31 - 1:
        raise ValueError(f"{op}: {what} = {value} exceeds the kernels' int32 range")
    return value


# ----- bias + GELU ---------------------------------------------------------------------------
def _gelu_inputs(op: str, x: Any, bias: Optional[Any], approximate: str):
    validate.approximate_mode(op, approximate)
    _, features = validate.rows_and_features(op, x)
    validate.per_feature(op, "bias", bias, features)
    x = _device_array(op, "input", x)
    b = _filled(0.0, features) if bias is None else _device_array(op, "bias", bias)
    return x, b, _int32(op, "features", features)


def bias_gelu_forward(x: Any, bias: Optional[Any] = None, approximate: str = "none") -> Any:
    """gelu(x + bias) in one pass; ``bias`` (features,) is broadcast over the last dim."""
    x, b, features = _gelu_inputs("bias_gelu_forward", x, bias, approximate)
    out = _cp().empty_like(x)
    if x.size:
        launch(_GELU_KERNELS[approximate, "forward"], (_grid_stride_blocks(x.size),), (_THREADS,),
               (x, b, out, x.size, features))
    return out


def bias_gelu_backward(grad_out: Any, x: Any, bias: Optional[Any] = None,
                       approximate: str = "none") -> Tuple[Any, Optional[Any]]:
    """(dL/dx, dL/dbias) of gelu(x + bias); dL/dbias is None without a bias."""
    op = "bias_gelu_backward"
    x, b, features = _gelu_inputs(op, x, bias, approximate)
    validate.same_shape(op, "grad_out", grad_out, x.shape)
    g = _device_array(op, "grad_out", grad_out)
    grad = _cp().empty_like(x)
    if x.size:
        launch(_GELU_KERNELS[approximate, "backward"], (_grid_stride_blocks(x.size),), (_THREADS,),
               (g, x, b, grad, x.size, features))
    if bias is None:
        return grad, None
    # the column sum as ones @ grad: a matrix-vector product (cuBLAS) ran 4.5x faster than
    # CuPy's sum(axis=0) on a 16384 x 3072 gradient
    rows = x.size // features
    return grad, _filled(1.0, rows) @ grad.reshape(rows, features)


# ----- softmax cross-entropy -----------------------------------------------------------------
def _ce_inputs(op: str, logits: Any, target: Any, ignore_index: int, label_smoothing: float,
               check_targets: bool = True):
    rows, classes = validate.class_targets(op, logits, target)
    smoothing = validate.label_smoothing(op, label_smoothing)
    z = _device_array(op, "logits", logits)
    cp = _cp()
    t = cp.ascontiguousarray(cp.asarray(target, dtype=cp.int64))
    if check_targets:  # reads a flag back from the GPU: the host waits for the queue to drain
        validate.target_values(op, t, classes, ignore_index)
    return z, t, _int32(op, "rows", rows), _int32(op, "classes", classes), smoothing


def cross_entropy_forward(logits: Any, target: Any, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> Tuple[Any, Any]:
    """(per-row loss, per-row logsumexp) of float32 logits (rows, classes); ignored rows 0."""
    op = "cross_entropy_forward"
    z, t, rows, classes, smoothing = _ce_inputs(op, logits, target, ignore_index,
                                                label_smoothing)
    cp = _cp()
    loss, lse = cp.empty(rows, dtype=cp.float32), cp.empty(rows, dtype=cp.float32)
    if rows:
        launch("softmax_cross_entropy_forward", (rows,), (_row_threads(classes),),
               (z, t, loss, lse, rows, classes, int(ignore_index), smoothing))
    return loss, lse


def cross_entropy_backward(grad_loss: Any, logits: Any, target: Any, lse: Any,
                           ignore_index: int = -100, label_smoothing: float = 0.0,
                           check_targets: bool = True) -> Any:
    """dL/dlogits from dL/dloss per row (``grad_loss``, shape (rows,)) and the saved lse.
    ``check_targets=False`` skips the target range check, for targets the forward checked."""
    op = "cross_entropy_backward"
    z, t, rows, classes, smoothing = _ce_inputs(op, logits, target, ignore_index,
                                                label_smoothing, check_targets)
    validate.same_shape(op, "grad_loss", grad_loss, (rows,))
    validate.same_shape(op, "lse", lse, (rows,))
    g, s = _device_array(op, "grad_loss", grad_loss), _device_array(op, "lse", lse)
    grad = _cp().empty_like(z)
    if rows:
        launch("softmax_cross_entropy_backward", (rows,), (_row_threads(classes),),
               (z, t, s, g, grad, rows, classes, int(ignore_index), smoothing))
    return grad


# ----- LayerNorm -----------------------------------------------------------------------------
_PARAM_ROWS_PER_BLOCK = 64


def layer_norm_forward(x: Any, weight: Optional[Any] = None, bias: Optional[Any] = None,
                       eps: float = 1e-5) -> Tuple[Any, Any, Any]:
    """(y, mean, rstd) over the last dimension; mean and rstd hold one value per row."""
    op = "layer_norm_forward"
    rows, cols = validate.rows_and_features(op, x)
    validate.per_feature(op, "weight", weight, cols)
    validate.per_feature(op, "bias", bias, cols)
    cp = _cp()
    x = _device_array(op, "input", x)
    w = _filled(1.0, cols) if weight is None else _device_array(op, "weight", weight)
    b = _filled(0.0, cols) if bias is None else _device_array(op, "bias", bias)
    y = cp.empty_like(x)
    mean, rstd = cp.empty(rows, dtype=cp.float32), cp.empty(rows, dtype=cp.float32)
    if rows:
        launch("layer_norm_forward", (_int32(op, "rows", rows),), (_row_threads(cols),),
               (x, w, b, y, mean, rstd, rows, _int32(op, "features", cols), float(eps)))
    return y, mean, rstd


def layer_norm_backward(grad_out: Any, x: Any, weight: Optional[Any], mean: Any,
                        rstd: Any) -> Tuple[Any, Any, Any]:
    """(dL/dx, dL/dweight, dL/dbias) from the forward's saved mean and rstd."""
    op = "layer_norm_backward"
    rows, cols = validate.rows_and_features(op, x)
    validate.same_shape(op, "grad_out", grad_out, x.shape)
    validate.per_feature(op, "weight", weight, cols)
    validate.same_shape(op, "mean", mean, (rows,))
    validate.same_shape(op, "rstd", rstd, (rows,))
    cp = _cp()
    x, g = _device_array(op, "input", x), _device_array(op, "grad_out", grad_out)
    w = _filled(1.0, cols) if weight is None else _device_array(op, "weight", weight)
    mu, rs = _device_array(op, "mean", mean), _device_array(op, "rstd", rstd)
    rows, cols = _int32(op, "rows", rows), _int32(op, "features", cols)
    dx = cp.empty_like(x)
    chunks = max(1, -(-rows // _PARAM_ROWS_PER_BLOCK))
    dw_part = cp.zeros((chunks, cols), dtype=cp.float32)
    db_part = cp.zeros((chunks, cols), dtype=cp.float32)
    if rows:
        launch("layer_norm_backward_input", (rows,), (_row_threads(cols),),
               (g, x, w, mu, rs, dx, rows, cols))
        launch("layer_norm_backward_params", (-(-cols // 32), chunks), (32, 8),
               (g, x, mu, rs, dw_part, db_part, rows, cols, _PARAM_ROWS_PER_BLOCK))
    return dx, dw_part.sum(axis=0), db_part.sum(axis=0)


# ----- multi-tensor AdamW --------------------------------------------------------------------
def adamw_step(params: Sequence[Any], grads: Sequence[Any], exp_avgs: Sequence[Any],
               exp_avg_sqs: Sequence[Any], *, step: int, lr: float, beta1: float, beta2: float,
               eps: float, weight_decay: float, maximize: bool = False) -> None:
    """One AdamW step on every float32 tensor of the lists, in place, in a single launch."""
    op = "adamw_step"
    count = validate.tensor_lists(op, params=params, grads=grads, exp_avgs=exp_avgs,
                                  exp_avg_sqs=exp_avg_sqs)
    validate.adam_hyper(op, step, lr, beta1, beta2, eps, weight_decay)
    lists = []
    for what, arrays in (("param", params), ("grad", grads), ("exp_avg", exp_avgs),
                         ("exp_avg_sq", exp_avg_sqs)):
        lists.append([_device_array(op, f"{what} {i}", a, contiguous=what != "grad")
                      for i, a in enumerate(arrays)])
    if count == 0:
        return
    sizes, block_tensor, block_start = _device_chunk_table(tuple(int(p.size) for p in lists[0]))
    if block_tensor.size == 0:
        return
    pointers = _device_pointer_table(lists)
    bias_correction1 = 1.0 - beta1 ** step
    launch("adamw_multi_tensor", (int(block_tensor.size),), (_THREADS,),
           (pointers[0], pointers[1], pointers[2], pointers[3], sizes, block_tensor, block_start,
            multi_tensor.CHUNK, 1.0 - lr * weight_decay, beta2, 1.0 - beta1, 1.0 - beta2,
            lr / bias_correction1, math.sqrt(1.0 - beta2 ** step), eps, int(bool(maximize))))


def _device_pointer_table(lists: Sequence[Sequence[Any]]) -> Any:
    """The device copy of the lists' pointer table, cached by its contents: parameters and
    optimizer state keep their addresses, and CuPy's pool hands each step's gradients the same
    few, so most steps skip a host-to-device copy."""
    table = multi_tensor.pointer_table(*lists)
    key = (table.tobytes(), _cp().cuda.Device().id)
    pointers = _pointer_tables.get(key)
    if pointers is None:
        if len(_pointer_tables) >= _MAX_CACHED_TABLES:
            _pointer_tables.clear()
        pointers = _pointer_tables[key] = _cp().asarray(table)
    return pointers


def _device_chunk_table(sizes: Tuple[int, ...]) -> Tuple[Any, Any, Any]:
    """(sizes, block_tensor, block_start) on the device, cached: a model's shapes repeat."""
    cp = _cp()
    key = (sizes, cp.cuda.Device().id)
    tables = _chunk_tables.get(key)
    if tables is None:
        block_tensor, block_start = multi_tensor.chunk_table(sizes)
        tables = (cp.asarray(sizes, dtype=cp.int64), cp.asarray(block_tensor),
                  cp.asarray(block_start))
        if len(_chunk_tables) >= _MAX_CACHED_TABLES:
            _chunk_tables.clear()
        _chunk_tables[key] = tables
    return tables


# ----- fp16 / fp32 unscale and inf check -----------------------------------------------------
def unscale_and_check_inf(grads: Sequence[Any], inv_scale: float,
                          found_inf: Optional[Any] = None) -> Any:
    """Multiply every gradient (float16 or float32) by ``inv_scale`` in place; ``found_inf``
    (float32, shape (1,), created as 0 when None) becomes 1 if any element was inf or NaN.
    Nothing is copied back to the host: read the flag when a decision needs it."""
    op = "unscale_and_check_inf"
    cp = _cp()
    flag = cp.zeros(1, dtype=cp.float32) if found_inf is None else found_inf
    validate.same_shape(op, "found_inf", flag, (1,))
    flag = _device_array(op, "found_inf", flag, contiguous=True)
    arrays = [_device_array(op, f"gradient {i}", g, ("float16", "float32"), contiguous=True)
              for i, g in enumerate(grads)]
    for g in arrays:
        if g.size:
            launch(_UNSCALE_KERNELS[dtype_name(g.dtype)], (_grid_stride_blocks(g.size),),
                   (_THREADS,), (g, g.size, float(inv_scale), flag))
    return flag


__all__ = [
    "adamw_step", "bias_gelu_backward", "bias_gelu_forward", "cross_entropy_backward",
    "cross_entropy_forward", "is_available", "launch", "layer_norm_backward",
    "layer_norm_forward", "unscale_and_check_inf",
]
