"""Numba CPU kernels against their NumPy forms, timed in the same run on one thread.

Candidates (``neural_arch.backends.numba_kernels``): the shared-memory all-reduce's slot
reduction at the slice sizes shm_direct uses, the float32 -> float16 cast of DDP's gradient
compression, top-k gradient compression, and fused softmax cross-entropy forward + backward.
Both forms of a case run in alternating batches (order flipped every repeat) after a warm-up
that also compiles; each reports its median per-call time; ratio = NumPy time / Numba time.
The run then checks ``NUMBA_LIMITS`` (up to which input size each public function runs the
Numba form) against what it measured: no case given to Numba may be slower beyond noise
(ratio >= ``1 / NOISE``), no case kept on NumPy may leave a clear gain unused (ratio <
``WIN_RATIO``). Outputs of the two forms are compared before timing.

    python benchmarks/bench_numba.py [--repeats 15] [--quick] [--output FILE.md]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable, Dict, List, NamedTuple, Tuple  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from neural_arch.backends import numba_backend  # noqa: E402
from neural_arch.backends import numba_kernels as nk  # noqa: E402

WIN_RATIO = 1.25  # a gain this clear must not be left unused; below it, noise on a shared core
NOISE = 1.10      # run-to-run spread of the per-call medians on a loaded 2-core machine
SECTION_START, SECTION_END = "<!-- bench_numba:start -->", "<!-- bench_numba:end -->"


class Case(NamedTuple):
    kernel: str   # key of NUMBA_LIMITS
    label: str
    size: int     # the input size NUMBA_LIMITS is compared with
    numpy: Callable[[], object]
    numba: Callable[[], object]
    check: Callable[[], None]  # raises when the two forms disagree


def _reduce_cases(rng: np.random.Generator, quick: bool) -> List[Case]:
    cases = []
    shapes = [(2, 256), (4, 256), (2, 1024), (4, 1024),  # shm_direct's small path (<= 4 KiB)
              (2, 1 << 17), (4, 1 << 16), (8, 1 << 15)]  # its 1 MiB rounds split p ways
    if not quick:
        shapes.append((4, 1 << 22))  # 16 MiB slots: beyond every cache
    for p, n in shapes:
        slots = tuple(rng.standard_normal(n).astype(np.float32) for _ in range(p))
        out_a, out_b = np.empty(n, np.float32), np.empty(n, np.float32)

        def check(slots=slots, a=out_a, b=out_b):
            nk.reduce_sum_into_numpy(a, slots)
            nk._reduce_sum_numba(b, slots)
            assert np.array_equal(a, b), "reduce_sum: forms differ"

        cases.append(Case("reduce_sum", f"p={p}, {n * 4 // 1024} KiB float32 slots", n,
                          lambda s=slots, o=out_a: nk.reduce_sum_into_numpy(o, s),
                          lambda s=slots, o=out_b: nk._reduce_sum_numba(o, s), check))
    return cases


def _cast_cases(rng: np.random.Generator, quick: bool) -> List[Case]:
    cases = []
    for n in ([1 << 16, 1 << 20] if quick else [1 << 16, 1 << 20, 1 << 24]):
        src = (rng.standard_normal(n) * 100).astype(np.float32)
        out_a, out_b = np.empty(n, np.float16), np.empty(n, np.float16)
        bits_in, bits_out = src.view(np.uint32), out_b.view(np.uint16)

        def check(src=src, a=out_a, b=out_b, bi=bits_in, bo=bits_out):
            np.copyto(a, src, casting="same_kind")
            nk._float16_bits_numba(bi, bo)
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), "cast: forms differ"

        cases.append(Case("cast_float16", f"{n * 4 // 1024} KiB float32", n,
                          lambda s=src, o=out_a: np.copyto(o, s, casting="same_kind"),
                          lambda bi=bits_in, bo=bits_out: nk._float16_bits_numba(bi, bo), check))
    return cases


def _topk_cases(rng: np.random.Generator, quick: bool) -> List[Case]:
    cases = []
    for n, fraction in [(1 << 16, 0.01), (1 << 20, 0.01)] + ([] if quick else [(1 << 22, 0.001)]):
        grad, k = rng.standard_normal(n).astype(np.float32), max(1, int(n * fraction))

        def check(grad=grad, k=k):
            a, b = nk._topk_numpy(grad, k), nk._topk_numba(grad, k)
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), "topk differs"

        cases.append(Case("topk", f"n={n}, k={k}", n, lambda g=grad, k=k: nk._topk_numpy(g, k),
                          lambda g=grad, k=k: nk._topk_numba(g, k), check))
    return cases


def _cross_entropy_cases(rng: np.random.Generator, quick: bool) -> List[Case]:
    cases = []
    shapes = [(64, 10), (512, 10), (64, 100), (128, 100), (512, 100), (512, 1000)]
    shapes += [] if quick else [(16, 50257)]
    for rows, classes in shapes:
        logits = (rng.standard_normal((rows, classes)) * 3).astype(np.float32)
        target = rng.integers(0, classes, rows)
        target[::7] = -100
        grad_a, grad_b = np.empty_like(logits), np.empty_like(logits)

        def check(z=logits, t=target, a=grad_a, b=grad_b):
            la = nk._cross_entropy_numpy(z, t, -100, a)
            lb = nk._cross_entropy_numba(z, t, -100, b)
            assert abs(la - lb) <= 1e-5 * max(1.0, abs(la)), f"cross_entropy loss {la} vs {lb}"
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)

        cases.append(Case("cross_entropy", f"{rows} x {classes}", rows * classes,
                          lambda z=logits, t=target, g=grad_a: nk._cross_entropy_numpy(z, t, -100,
                                                                                      g),
                          lambda z=logits, t=target, g=grad_b: nk._cross_entropy_numba(z, t, -100,
                                                                                      g),
                          check))
    return cases


def _calls_for(fn: Callable[[], object], target_s: float = 0.02) -> int:
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(10000, int(target_s / once)))


def _time(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def measure(case: Case, repeats: int) -> Tuple[float, float]:
    """Median seconds per call of (NumPy form, Numba form), batches interleaved."""
    case.check()  # also compiles the Numba form
    for fn in (case.numpy, case.numba):
        fn()
    calls = min(_calls_for(case.numpy), _calls_for(case.numba))
    times: Dict[str, List[float]] = {"numpy": [], "numba": []}
    for r in range(repeats):
        order = [("numpy", case.numpy), ("numba", case.numba)]
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            times[name].append(_time(fn, calls))
    return float(np.median(times["numpy"])), float(np.median(times["numba"]))


def run(repeats: int, quick: bool) -> List[Tuple[Case, float, float]]:
    rng = np.random.default_rng(0)
    cases = (_reduce_cases(rng, quick) + _cast_cases(rng, quick) + _topk_cases(rng, quick)
             + _cross_entropy_cases(rng, quick))
    results = []
    for case in cases:
        numpy_s, numba_s = measure(case, repeats)
        results.append((case, numpy_s, numba_s))
        print(f"  {case.kernel:14s} {case.label:34s} numpy {numpy_s * 1e6:10.1f} us  "
              f"numba {numba_s * 1e6:10.1f} us  ratio {numpy_s / numba_s:5.2f}", flush=True)
    return results


def _agrees(form: str, ratio: float) -> bool:
    return ratio >= 1.0 / NOISE if form == "numba" else ratio < WIN_RATIO


def report(results: List[Tuple[Case, float, float]], command: str) -> Tuple[str, bool]:
    """The Markdown section, and whether NUMBA_LIMITS agrees with every measured case."""
    lines = ["## Numba CPU kernels vs NumPy (`benchmarks/bench_numba.py`)", "",
             f"Command: `{command}`", "",
             f"Machine: {platform.processor() or platform.machine()}; {os.cpu_count()} cores; "
             f"Python {platform.python_version()}; NumPy {np.__version__}; Numba "
             f"{__import__('numba').__version__}; load average {os.getloadavg()[0]:.2f}; "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}", "",
             "One thread; median per-call time over interleaved batches. ratio = NumPy time / "
             "Numba time (> 1: Numba faster). 'runs' is the form the public function uses for "
             f"that size under NUMBA_LIMITS; it agrees when Numba runs only at ratio >= "
             f"{1 / NOISE:.2f} and NumPy only at ratio < {WIN_RATIO}.", "",
             "| kernel | case | NumPy us | Numba us | ratio | runs | agrees |",
             "|---|---|---:|---:|---:|---|:---:|"]
    consistent = True
    for case, numpy_s, numba_s in results:
        ratio = numpy_s / numba_s
        form = nk.form_in_use(case.kernel, case.size)
        ok = _agrees(form, ratio)
        consistent &= ok
        lines.append(f"| {case.kernel} | {case.label} | {numpy_s * 1e6:.1f} | "
                     f"{numba_s * 1e6:.1f} | {ratio:.2f} | {form} | {'yes' if ok else 'NO'} |")
    lines += ["", "NUMBA_LIMITS: " + ", ".join(f"{k} {'no limit' if v is None else v}"
                                              for k, v in nk.NUMBA_LIMITS.items())
              + f"; consistent with this run: {'yes' if consistent else 'NO'}."]
    return "\n".join(lines) + "\n", consistent


def _write_section(path: str, section: str) -> None:
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmark results\n"
    block = f"{SECTION_START}\n{section}{SECTION_END}"
    if SECTION_START in text and SECTION_END in text:
        head, rest = text.split(SECTION_START, 1)
        text = head + block + rest.split(SECTION_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed batches per form")
    parser.add_argument("--quick", action="store_true", help="skip the largest cases")
    parser.add_argument("--output", help="Markdown file to write (or update) the section in")
    args = parser.parse_args(argv)
    if not numba_backend.is_available():
        print(f"bench_numba: nothing to compare: {numba_backend.unavailable_reason()}")
        return 1
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    command = "python benchmarks/bench_numba.py " + " ".join(argv if argv is not None
                                                             else sys.argv[1:])
    section, consistent = report(run(args.repeats, args.quick), command.strip())
    print("\n" + section)
    if args.output:
        _write_section(args.output, section)
    return 0 if consistent else 2


if __name__ == "__main__":
    sys.exit(main())
