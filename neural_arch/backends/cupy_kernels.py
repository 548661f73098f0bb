"""Fused CUDA kernels on CuPy arrays: bias+GELU, softmax cross-entropy, LayerNorm, multi-tensor
AdamW and fp16/fp32 gradient unscaling.

The sources live in ``neural_arch/backends/kernels/*.cu`` and are compiled with
``cupy.RawModule`` on first use (once per source file and device; see ``cupy_launch``). Every
function here has the signature of its float64 definition in
``neural_arch.backends.kernels.reference``; the kernels compute in float32 (the unscale kernel
also takes float16). Importing this module never needs CuPy; calling a kernel without CuPy or a
GPU raises RuntimeError saying why.

Only arrays come in and out. The autograd-aware forms for tensors (``fused_bias_gelu``,
``fused_cross_entropy``, ``fused_layer_norm``) are in ``neural_arch.core.fused_kernels`` and the
``FusedAdamW`` optimizer in ``neural_arch.optim.fused_adamw``: they sit above the backends and
call these functions.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

# CuPy and the launcher are reached through the module (``gpu.array_module()``,
# ``gpu.launch``): a GPU-less run stands in for both there, and every wrapper here follows.
from . import cupy_launch as gpu
from .cupy_launch import is_available, launch
from .kernels import multi_tensor, validate

_chunk_tables: Dict[Tuple[Tuple[int, ...], int], Tuple[Any, Any, Any]] = {}
_pointer_tables: Dict[Tuple[bytes, int], Any] = {}
_GELU_KERNELS = {
    ("none", "forward"): "bias_gelu_erf_forward", ("tanh", "forward"): "bias_gelu_tanh_forward",
    ("none", "backward"): "bias_gelu_erf_backward",
    ("tanh", "backward"): "bias_gelu_tanh_backward",
}
_UNSCALE_KERNELS = {"float16": "unscale_check_inf_f16", "float32": "unscale_check_inf_f32"}


# ----- bias + GELU ---------------------------------------------------------------------------
def _gelu_inputs(op: str, x: Any, bias: Optional[Any], approximate: str):
    validate.approximate_mode(op, approximate)
    _, features = validate.rows_and_features(op, x)
    validate.per_feature(op, "bias", bias, features)
    x = gpu.device_array(op, "input", x)
    b = gpu.filled(0.0, features) if bias is None else gpu.device_array(op, "bias", bias)
    return x, b, gpu.int32_arg(op, "features", features)


def bias_gelu_forward(x: Any, bias: Optional[Any] = None, approximate: str = "none") -> Any:
    """gelu(x + bias) in one pass; ``bias`` (features,) is broadcast over the last dim."""
    x, b, features = _gelu_inputs("bias_gelu_forward", x, bias, approximate)
    out = gpu.array_module().empty_like(x)
    if x.size:
        gpu.launch(_GELU_KERNELS[approximate, "forward"], (gpu.grid_stride_blocks(x.size),),
                   (gpu.THREADS,), (x, b, out, x.size, features))
    return out


def bias_gelu_backward(grad_out: Any, x: Any, bias: Optional[Any] = None,
                       approximate: str = "none") -> Tuple[Any, Optional[Any]]:
    """(dL/dx, dL/dbias) of gelu(x + bias); dL/dbias is None without a bias."""
    op = "bias_gelu_backward"
    x, b, features = _gelu_inputs(op, x, bias, approximate)
    validate.same_shape(op, "grad_out", grad_out, x.shape)
    g = gpu.device_array(op, "grad_out", grad_out)
    grad = gpu.array_module().empty_like(x)
    if x.size:
        gpu.launch(_GELU_KERNELS[approximate, "backward"], (gpu.grid_stride_blocks(x.size),),
                   (gpu.THREADS,), (g, x, b, grad, x.size, features))
    if bias is None:
        return grad, None
    # the column sum as ones @ grad: a matrix-vector product (cuBLAS) ran 4.5x faster than
    # CuPy's sum(axis=0) on a 16384 x 3072 gradient
    rows = x.size // features
    return grad, gpu.filled(1.0, rows) @ grad.reshape(rows, features)


# ----- softmax cross-entropy -----------------------------------------------------------------
def _ce_inputs(op: str, logits: Any, target: Any, ignore_index: int, label_smoothing: float,
               check_targets: bool = True):
    rows, classes = validate.class_targets(op, logits, target)
    smoothing = validate.label_smoothing(op, label_smoothing)
    z = gpu.device_array(op, "logits", logits)
    cp = gpu.array_module()
    t = cp.ascontiguousarray(cp.asarray(target, dtype=cp.int64))
    if check_targets:  # reads a flag back from the GPU: the host waits for the queue to drain
        validate.target_values(op, t, classes, ignore_index)
    return (z, t, gpu.int32_arg(op, "rows", rows), gpu.int32_arg(op, "classes", classes),
            smoothing)


def cross_entropy_forward(logits: Any, target: Any, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> Tuple[Any, Any]:
    """(per-row loss, per-row logsumexp) of float32 logits (rows, classes); ignored rows 0."""
    op = "cross_entropy_forward"
    z, t, rows, classes, smoothing = _ce_inputs(op, logits, target, ignore_index,
                                                label_smoothing)
    cp = gpu.array_module()
    loss, lse = cp.empty(rows, dtype=cp.float32), cp.empty(rows, dtype=cp.float32)
    if rows:
        gpu.launch("softmax_cross_entropy_forward", (rows,), (gpu.row_threads(classes),),
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
    g, s = gpu.device_array(op, "grad_loss", grad_loss), gpu.device_array(op, "lse", lse)
    grad = gpu.array_module().empty_like(z)
    if rows:
        gpu.launch("softmax_cross_entropy_backward", (rows,), (gpu.row_threads(classes),),
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
    cp = gpu.array_module()
    x = gpu.device_array(op, "input", x)
    w = gpu.filled(1.0, cols) if weight is None else gpu.device_array(op, "weight", weight)
    b = gpu.filled(0.0, cols) if bias is None else gpu.device_array(op, "bias", bias)
    y = cp.empty_like(x)
    mean, rstd = cp.empty(rows, dtype=cp.float32), cp.empty(rows, dtype=cp.float32)
    if rows:
        gpu.launch("layer_norm_forward", (gpu.int32_arg(op, "rows", rows),),
                   (gpu.row_threads(cols),),
                   (x, w, b, y, mean, rstd, rows, gpu.int32_arg(op, "features", cols), float(eps)))
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
    cp = gpu.array_module()
    x, g = gpu.device_array(op, "input", x), gpu.device_array(op, "grad_out", grad_out)
    w = gpu.filled(1.0, cols) if weight is None else gpu.device_array(op, "weight", weight)
    mu, rs = gpu.device_array(op, "mean", mean), gpu.device_array(op, "rstd", rstd)
    rows, cols = gpu.int32_arg(op, "rows", rows), gpu.int32_arg(op, "features", cols)
    dx = cp.empty_like(x)
    chunks = max(1, -(-rows // _PARAM_ROWS_PER_BLOCK))
    dw_part = cp.zeros((chunks, cols), dtype=cp.float32)
    db_part = cp.zeros((chunks, cols), dtype=cp.float32)
    if rows:
        gpu.launch("layer_norm_backward_input", (rows,), (gpu.row_threads(cols),),
                   (g, x, w, mu, rs, dx, rows, cols))
        gpu.launch("layer_norm_backward_params", (-(-cols // 32), chunks), (32, 8),
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
        lists.append([gpu.device_array(op, f"{what} {i}", a, contiguous=what != "grad")
                      for i, a in enumerate(arrays)])
    if count == 0:
        return
    sizes, block_tensor, block_start = _device_chunk_table(tuple(int(p.size) for p in lists[0]))
    if block_tensor.size == 0:
        return
    pointers = _device_pointer_table(lists)
    bias_correction1 = 1.0 - beta1 ** step
    gpu.launch("adamw_multi_tensor", (int(block_tensor.size),), (gpu.THREADS,),
               (pointers[0], pointers[1], pointers[2], pointers[3], sizes, block_tensor,
                block_start, multi_tensor.CHUNK, 1.0 - lr * weight_decay, beta2, 1.0 - beta1,
                1.0 - beta2, lr / bias_correction1, math.sqrt(1.0 - beta2 ** step), eps,
                int(bool(maximize))))


def _device_pointer_table(lists: Sequence[Sequence[Any]]) -> Any:
    """The device copy of the lists' pointer table, cached by its contents: parameters and
    optimizer state keep their addresses, and CuPy's pool hands each step's gradients the same
    few, so most steps skip a host-to-device copy."""
    table = multi_tensor.pointer_table(*lists)
    key = (table.tobytes(), gpu.array_module().cuda.Device().id)
    pointers = _pointer_tables.get(key)
    if pointers is None:
        if len(_pointer_tables) >= gpu.MAX_CACHED_TABLES:
            _pointer_tables.clear()
        pointers = _pointer_tables[key] = gpu.array_module().asarray(table)
    return pointers


def _device_chunk_table(sizes: Tuple[int, ...]) -> Tuple[Any, Any, Any]:
    """(sizes, block_tensor, block_start) on the device, cached: a model's shapes repeat."""
    cp = gpu.array_module()
    key = (sizes, cp.cuda.Device().id)
    tables = _chunk_tables.get(key)
    if tables is None:
        block_tensor, block_start = multi_tensor.chunk_table(sizes)
        tables = (cp.asarray(sizes, dtype=cp.int64), cp.asarray(block_tensor),
                  cp.asarray(block_start))
        if len(_chunk_tables) >= gpu.MAX_CACHED_TABLES:
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
    cp = gpu.array_module()
    flag = cp.zeros(1, dtype=cp.float32) if found_inf is None else found_inf
    validate.same_shape(op, "found_inf", flag, (1,))
    flag = gpu.device_array(op, "found_inf", flag, contiguous=True)
    arrays = [gpu.device_array(op, f"gradient {i}", g, ("float16", "float32"), contiguous=True)
              for i, g in enumerate(grads)]
    for g in arrays:
        if g.size:
            gpu.launch(_UNSCALE_KERNELS[gpu.dtype_name(g.dtype)],
                       (gpu.grid_stride_blocks(g.size),), (gpu.THREADS,),
                       (g, g.size, float(inv_scale), flag))
    return flag


__all__ = [
    "adamw_step", "bias_gelu_backward", "bias_gelu_forward", "cross_entropy_backward",
    "cross_entropy_forward", "is_available", "launch", "layer_norm_backward",
    "layer_norm_forward", "unscale_and_check_inf",
]
