"""Fused CUDA kernels against the unfused CuPy composition and the device copy bandwidth, plus
training steps on the GPU against the CPU, all measured in one run.

Each kernel's effective bandwidth (bytes it must read and write / time) is set against the
device-to-device copy bandwidth measured first (``dst[...] = src``); the goal is fused AdamW
at >= 70% of it. GPU times come from CUDA events around ``--iters`` calls after a warm-up (which
also compiles); CPU step times are medians of wall-clock steps. Every fused result is checked
against its unfused composition before it is timed.

    python benchmarks/bench_gpu.py [--iters 50] [--quick] [--output FILE.md]
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
import time
from typing import Callable, List, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from neural_arch.backends import cupy_backend  # noqa: E402

ADAMW_GOAL = 0.70
SECTION_START, SECTION_END = "<!-- bench_gpu:start -->", "<!-- bench_gpu:end -->"
Row = Tuple[str, str, float, float, float]  # kernel, case, fused ms, unfused ms, bytes moved


def gpu_ms(fn: Callable[[], object], iters: int) -> float:
    """Milliseconds per call of ``fn`` on the current stream (CUDA events, after a warm-up)."""
    import cupy as cp
    fn()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / iters


def _agree(name: str, fused, unfused, rtol: float, atol: float) -> None:
    import cupy as cp
    for a, b in zip(fused if isinstance(fused, tuple) else (fused,),
                    unfused if isinstance(unfused, tuple) else (unfused,)):
        np.testing.assert_allclose(cp.asnumpy(a), cp.asnumpy(b), rtol=rtol, atol=atol,
                                   err_msg=f"{name}: fused and unfused results differ")


def kernel_rows(iters: int, quick: bool) -> Tuple[float, List[Row]]:
    """(copy GB/s, rows) for every kernel."""
    import cupy as cp
    from cupyx.scipy.special import erf

    from neural_arch.backends import cupy_kernels as K
    rng = cp.random.default_rng(0)
    n = (1 << 24) if quick else (1 << 26)
    src, dst = rng.standard_normal(n, dtype=cp.float32), cp.empty(n, cp.float32)
    copy_ms = gpu_ms(lambda: dst.__setitem__(Ellipsis, src), iters)
    copy_gbs = 2 * src.nbytes / copy_ms / 1e6
    rows: List[Row] = []

    rows_, feat = (4096, 3072) if quick else (16384, 3072)
    x = rng.standard_normal((rows_, feat), dtype=cp.float32)
    b = rng.standard_normal(feat, dtype=cp.float32)
    g = rng.standard_normal((rows_, feat), dtype=cp.float32)

    def gelu_unfused():
        v = x + b
        return 0.5 * v * (1.0 + erf(v * math.sqrt(0.5)))

    def gelu_backward_unfused():
        v = x + b
        grad = g * (0.5 * (1.0 + erf(v * math.sqrt(0.5))) + v * cp.exp(-0.5 * v * v)
                    / math.sqrt(2 * math.pi))
        return grad, grad.sum(axis=0)

    _agree("bias_gelu_forward", K.bias_gelu_forward(x, b), gelu_unfused(), 1e-5, 1e-5)
    _agree("bias_gelu_backward", K.bias_gelu_backward(g, x, b), gelu_backward_unfused(), 1e-4,
           1e-3)
    case = f"{rows_} x {feat}"
    rows.append(("bias_gelu_forward", case, gpu_ms(lambda: K.bias_gelu_forward(x, b), iters),
                 gpu_ms(gelu_unfused, iters), 2 * x.nbytes))
    rows.append(("bias_gelu_backward", case, gpu_ms(lambda: K.bias_gelu_backward(g, x, b), iters),
                 gpu_ms(gelu_backward_unfused, iters), 3 * x.nbytes))

    ce_rows, classes = (1024, 32000) if quick else (8192, 32000)
    z = rng.standard_normal((ce_rows, classes), dtype=cp.float32) * 3
    t = cp.asarray(np.random.default_rng(1).integers(0, classes, ce_rows))
    upstream = cp.full(ce_rows, 1.0 / ce_rows, cp.float32)

    def ce_fused():
        loss, lse = K.cross_entropy_forward(z, t)
        return loss, K.cross_entropy_backward(upstream, z, t, lse, check_targets=False)

    def ce_unfused():
        shifted = z - z.max(axis=1, keepdims=True)
        e = cp.exp(shifted)
        s = e.sum(axis=1)
        loss = cp.log(s) - shifted[cp.arange(ce_rows), t]
        grad = e / s[:, None]
        grad[cp.arange(ce_rows), t] -= 1.0
        return loss, grad * upstream[:, None]

    _agree("cross_entropy", ce_fused(), ce_unfused(), 1e-4, 1e-5)
    rows.append(("cross_entropy fwd+bwd", f"{ce_rows} x {classes}", gpu_ms(ce_fused, iters),
                 gpu_ms(ce_unfused, iters), 3 * z.nbytes))

    ln_rows, cols = (4096, 1024) if quick else (16384, 1024)
    xl = rng.standard_normal((ln_rows, cols), dtype=cp.float32)
    w, bl = rng.standard_normal(cols, dtype=cp.float32), rng.standard_normal(cols, dtype=cp.float32)
    gl = rng.standard_normal((ln_rows, cols), dtype=cp.float32)

    def ln_fused():
        y, mean, rstd = K.layer_norm_forward(xl, w, bl)
        return (y,) + K.layer_norm_backward(gl, xl, w, mean, rstd)

    def ln_unfused():
        centered = xl - xl.mean(axis=1, keepdims=True)
        rstd = 1.0 / cp.sqrt((centered * centered).mean(axis=1, keepdims=True) + 1e-5)
        xhat = centered * rstd
        gh = gl * w
        dx = rstd * (gh - gh.mean(axis=1, keepdims=True)
                     - xhat * (gh * xhat).mean(axis=1, keepdims=True))
        return xhat * w + bl, dx, (gl * xhat).sum(axis=0), gl.sum(axis=0)

    _agree("layer_norm", ln_fused(), ln_unfused(), 1e-4, 1e-2)
    rows.append(("layer_norm fwd+bwd", f"{ln_rows} x {cols}", gpu_ms(ln_fused, iters),
                 gpu_ms(ln_unfused, iters), 6 * xl.nbytes))

    rows.append(_adamw_row(rng, iters, quick))
    half = rng.standard_normal(n, dtype=cp.float32).astype(cp.float16)
    rows.append(("unscale fp16", f"{n} elements",
                 gpu_ms(lambda: K.unscale_and_check_inf([half], 1.0), iters),
                 gpu_ms(lambda: (half.__imul__(1.0), ~cp.isfinite(half).all()), iters),
                 2 * half.nbytes))
    return copy_gbs, rows


def _adamw_row(rng, iters: int, quick: bool) -> Row:
    """GPT-2-small-like parameter shapes; unfused = AdamW's rule per tensor in CuPy ops."""
    import cupy as cp

    from neural_arch.backends import cupy_kernels as K
    layers = 2 if quick else 12
    shapes = [(50257, 768), (1024, 768)] + [s for _ in range(layers) for s in (
        (768,), (768,), (2304, 768), (2304,), (768, 768), (768,), (768,), (768,), (3072, 768),
        (3072,), (768, 3072), (768,))]
    params = [rng.standard_normal(s, dtype=cp.float32) for s in shapes]
    grads = [rng.standard_normal(s, dtype=cp.float32) for s in shapes]
    state = [[cp.zeros(s, cp.float32) for s in shapes] for _ in range(2)]
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)

    def fused():
        K.adamw_step(params, grads, state[0], state[1], step=10, **hyper)

    def unfused():
        bc1, bc2 = 1 - 0.9 ** 10, math.sqrt(1 - 0.999 ** 10)
        for p, g, m, v in zip(params, grads, state[0], state[1]):
            p *= 1 - 1e-3 * 0.1
            m += (g - m) * (1 - 0.9)
            v *= 0.999
            v += (1 - 0.999) * (g * g)
            p -= (1e-3 / bc1) * (m / (cp.sqrt(v) / bc2 + 1e-8))

    saved = [a.copy() for a in params + state[0] + state[1]]
    fused()
    after_fused = [p.copy() for p in params]
    for a, b in zip(params + state[0] + state[1], saved):
        a[...] = b
    unfused()
    _agree("adamw", tuple(after_fused), tuple(params), 1e-5, 1e-6)
    total = sum(p.size for p in params)
    return ("adamw multi-tensor", f"{len(shapes)} tensors, {total / 1e6:.0f}M params",
            gpu_ms(fused, iters), gpu_ms(unfused, iters), 7 * 4 * total)


def step_rows(steps: int, quick: bool) -> List[Tuple[str, float, float]]:
    """(model, CPU ms per step, GPU ms per step) for an MLP and a one-block GPT."""
    import cupy as cp

    from neural_arch import functional as F
    from neural_arch.core import Tensor
    from neural_arch.models import GPT, MLP
    from neural_arch.models.gpt import GPTConfig
    from neural_arch.optim.fused_adamw import FusedAdamW
    from neural_arch.optim import SGD
    rng = np.random.default_rng(0)
    batch = 128 if quick else 512
    x, y = rng.standard_normal((batch, 784)).astype(np.float32), rng.integers(0, 10, batch)
    tokens = rng.integers(0, 256, (8, 128))
    config = GPTConfig(block_size=128, vocab_size=256, n_layer=1, n_head=4, n_embd=256)
    results = []
    for name, build, make_opt, loss_of in (
            (f"MLP 784-1024-1024-10, batch {batch}", lambda: MLP([784, 1024, 1024, 10]),
             lambda m: SGD(m.parameters(), lr=0.01, momentum=0.9),
             lambda m, dev: F.cross_entropy(m(Tensor(x, device=dev)), Tensor(y, device=dev))),
            ("GPT 1 block, d=256, 8 x 128 tokens, FusedAdamW", lambda: GPT(config),
             lambda m: FusedAdamW(m.parameters(), lr=1e-3),  # AdamW's own step on the CPU
             lambda m, dev: m(tokens, tokens)[1])):
        times = {}
        for device in ("cpu", "cuda"):
            try:
                model = build().to(device)
                opt = make_opt(model)
                durations = []
                for _ in range(steps + 2):
                    start = time.perf_counter()
                    opt.zero_grad()
                    loss_of(model, device).backward()
                    opt.step()
                    if device == "cuda":
                        cp.cuda.get_current_stream().synchronize()
                    durations.append(time.perf_counter() - start)
                times[device] = float(np.median(durations[2:])) * 1e3
            except Exception as exc:  # reported in the table rather than ending the run
                times[device] = f"failed: {type(exc).__name__}: {exc}"[:120]
        results.append((name, times["cpu"], times["cuda"]))
    return results


def report(copy_gbs: float, rows: List[Row], steps, command: str) -> str:
    import cupy as cp
    device_name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    if isinstance(device_name, bytes):
        device_name = device_name.decode()
    lines = ["## GPU kernels (`benchmarks/bench_gpu.py`)", "", f"Command: `{command}`", "",
             f"Device: {device_name}; CuPy {cp.__version__}; "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "",
             f"Device-to-device copy: {copy_gbs:.0f} GB/s (read + write). Effective bandwidth = "
             "bytes the kernel must read and write / fused time.", "",
             "| kernel | case | fused ms | unfused CuPy ms | speed-up | effective GB/s | "
             "% of copy |", "|---|---|---:|---:|---:|---:|---:|"]
    adamw_share = 0.0
    for kernel, case, fused, unfused, nbytes in rows:
        gbs = nbytes / fused / 1e6
        share = gbs / copy_gbs
        if kernel.startswith("adamw"):
            adamw_share = share
        lines.append(f"| {kernel} | {case} | {fused:.3f} | {unfused:.3f} | "
                     f"{unfused / fused:.2f}x | {gbs:.0f} | {100 * share:.0f}% |")
    verdict = "PASS" if adamw_share >= ADAMW_GOAL else "MISS"
    lines += ["", f"Goal: fused AdamW >= {100 * ADAMW_GOAL:.0f}% of copy bandwidth: "
              f"{100 * adamw_share:.0f}% ({verdict})", "",
              f"Training steps: the CPU column runs NumPy {np.__version__} on this machine's "
              f"{os.cpu_count()} logical CPUs; GPU times include the host's Python work.", "",
              "| training step | CPU ms | GPU ms | GPU speed-up |", "|---|---:|---:|---:|"]
    for name, cpu, gpu in steps:
        if isinstance(cpu, float) and isinstance(gpu, float):
            lines.append(f"| {name} | {cpu:.2f} | {gpu:.2f} | {cpu / gpu:.1f}x |")
        else:
            lines.append(f"| {name} | {cpu if isinstance(cpu, str) else f'{cpu:.2f}'} | "
                         f"{gpu if isinstance(gpu, str) else f'{gpu:.2f}'} | |")
    return "\n".join(lines) + "\n"


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=50, help="timed calls per kernel")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per device")
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--output", help="Markdown file to write (or update) the section in")
    args = parser.parse_args(argv)
    try:
        cupy_backend.require()
    except RuntimeError as exc:
        print(f"bench_gpu: no GPU to benchmark here: {exc}", file=sys.stderr)
        return 1
    command = "python benchmarks/bench_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    copy_gbs, rows = kernel_rows(args.iters, args.quick)
    section = report(copy_gbs, rows, step_rows(args.steps, args.quick), command.strip())
    print(section)
    if args.output:
        _write_section(args.output, section)
    return 0


def _write_section(path: str, section: str) -> None:
    """Replace this benchmark's marked section of ``path`` (or append it)."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmark results\n"
    block = f"{SECTION_START}\n{section}{SECTION_END}"
    if SECTION_START in text and SECTION_END in text:
        head, rest = text.split(SECTION_START, 1)
        text = head + block + rest.split(SECTION_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
