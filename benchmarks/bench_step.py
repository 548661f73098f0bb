"""Time one training step of an MLP: neural_arch against the same math in plain NumPy.

A step is forward (Linear layers with ReLU), cross-entropy, backward and an SGD update, in
float32 on one thread. Torch CPU is timed too when it is installed. Steps of the three
implementations are interleaved (in rotating order) so that machine noise hits them alike; each
reports the median.

    python benchmarks/bench_step.py [--steps 40] [--output benchmarks/RESULTS.md] [--profile]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402
import bench_reporting as reporting  # noqa: E402

from neural_arch import functional as F  # noqa: E402
from neural_arch.models import MLP  # noqa: E402
from neural_arch.optim import SGD  # noqa: E402

GOAL = 1.15
LR = 0.01
CONFIGS = [([784, 256, 10], 64), ([784, 256, 10], 512),
           ([784, 1024, 1024, 10], 64), ([784, 1024, 1024, 10], 512)]
SECTION = "bench_step"  # the marked section of RESULTS.md this script owns


class NumpyMLP:
    """The same network written by hand: explicit forward, backward and SGD update."""

    def __init__(self, weights: List[np.ndarray], biases: List[np.ndarray]) -> None:
        self.weights = [w.copy() for w in weights]
        self.biases = [b.copy() for b in biases]

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        activations = [x]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            out = activations[-1] @ w.T + b
            activations.append(np.maximum(out, 0) if i < len(self.weights) - 1 else out)
        logits = activations[-1]
        shifted = logits - logits.max(axis=1, keepdims=True)
        exp = np.exp(shifted)
        total = exp.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(np.log(total[:, 0]).mean() - shifted[rows, y].mean())
        grad = exp / total
        grad[rows, y] -= 1
        grad /= len(y)
        for i in range(len(self.weights) - 1, -1, -1):
            grad_w = grad.T @ activations[i]
            grad_b = grad.sum(axis=0)
            if i > 0:
                grad = (grad @ self.weights[i]) * (activations[i] > 0)
            self.weights[i] -= LR * grad_w
            self.biases[i] -= LR * grad_b
        return loss


class NeuralArchMLP:
    def __init__(self, sizes: List[int], weights: List[np.ndarray], biases: List[np.ndarray]):
        self.model = MLP(sizes)
        linears = [m for m in self.model if hasattr(m, "weight")]
        for layer, w, b in zip(linears, weights, biases):
            layer.weight.array[...] = w
            layer.bias.array[...] = b
        self.linears = linears
        self.optimizer = SGD(self.model.parameters(), lr=LR)

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        loss = F.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.array)


class TorchMLP:
    def __init__(self, torch, sizes, weights, biases):
        self.torch = torch
        layers = []
        for i, (w, b) in enumerate(zip(weights, biases)):
            linear = torch.nn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(w))
                linear.bias.copy_(torch.from_numpy(b))
            layers.append(linear)
            if i < len(weights) - 1:
                layers.append(torch.nn.ReLU())
        self.model = torch.nn.Sequential(*layers)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)

    def step(self, x, y) -> float:
        loss = self.torch.nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def _load_torch():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch


def _initial_parameters(sizes: List[int], rng: np.random.Generator):
    weights, biases = [], []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1 / np.sqrt(fan_in)
        weights.append(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32))
        biases.append(rng.uniform(-bound, bound, fan_out).astype(np.float32))
    return weights, biases


def _check_same_math(sizes: List[int], batch: int) -> None:
    """One step of each implementation from the same start must give the same parameters."""
    rng = np.random.default_rng(1)
    weights, biases = _initial_parameters(sizes, rng)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    ours, reference = NeuralArchMLP(sizes, weights, biases), NumpyMLP(weights, biases)
    loss_ours, loss_ref = ours.step(x, y), reference.step(x, y)
    if not np.isclose(loss_ours, loss_ref, rtol=1e-4):
        raise RuntimeError(f"losses differ: neural_arch {loss_ours} vs NumPy {loss_ref}")
    for layer, w in zip(ours.linears, reference.weights):
        if not np.allclose(layer.weight.array, w, rtol=1e-4, atol=1e-6):
            raise RuntimeError(f"weights after one step differ for layer {layer}")


def time_config(sizes: List[int], batch: int, steps: int, warmup: int, torch) -> Dict[str, float]:
    rng = np.random.default_rng(0)
    weights, biases = _initial_parameters(sizes, rng)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    runners: Dict[str, Callable[[], float]] = {}
    ours, reference = NeuralArchMLP(sizes, weights, biases), NumpyMLP(weights, biases)
    runners["neural_arch"] = lambda: ours.step(x, y)
    runners["numpy"] = lambda: reference.step(x, y)
    if torch is not None:
        theirs = TorchMLP(torch, sizes, weights, biases)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        runners["torch"] = lambda: theirs.step(tx, ty)
    return common.interleaved_step_ms(runners, steps, warmup)


def markdown_table(rows: List[dict], has_torch: bool) -> str:
    head = "| model | batch | neural_arch ms | NumPy ms |"
    rule = "|---|---:|---:|---:|"
    if has_torch:
        head += " torch ms |"
        rule += "---:|"
    head += f" neural_arch / NumPy | {'torch / NumPy | ' if has_torch else ''}goal (<= {GOAL}x) |"
    rule += "---:|" + ("---:|" if has_torch else "") + ":---:|"
    lines = [head, rule]
    for row in rows:
        ratio = row["neural_arch"] / row["numpy"]
        cells = [row["model"], str(row["batch"]), f"{row['neural_arch']:.3f}",
                 f"{row['numpy']:.3f}"]
        if has_torch:
            cells.append(f"{row['torch']:.3f}")
        cells.append(f"{ratio:.3f}")
        if has_torch:
            cells.append(f"{row['torch'] / row['numpy']:.3f}")
        cells.append("met" if ratio <= GOAL else "not met")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(path: str, table: str, command: str, torch) -> None:
    torch_note = f"torch {torch.__version__}" if torch is not None else "torch not installed"
    machine = (f"{reporting.cpu_model()}; Python {platform.python_version()}; "
               f"NumPy {np.__version__}")
    body = "\n".join([
        "## Training step: neural_arch vs NumPy (`benchmarks/bench_step.py`)",
        "",
        "One step = forward (Linear + ReLU), cross-entropy, backward, SGD update; float32, one "
        "thread, median over interleaved steps.",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine}; {torch_note}; "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        "",
        table,
    ])
    reporting.write_section(path, SECTION, body)


def profile(sizes: List[int], batch: int, steps: int) -> None:
    import cProfile
    import pstats

    rng = np.random.default_rng(0)
    weights, biases = _initial_parameters(sizes, rng)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    ours = NeuralArchMLP(sizes, weights, biases)
    ours.step(x, y)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        ours.step(x, y)
    profiler.disable()
    print(f"\nprofile of {steps} neural_arch steps, MLP {sizes}, batch {batch}:")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main(argv: Optional[List[str]] = None) -> List[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per implementation")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--output", help="write or update the results section of this file")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if installed")
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile of neural_arch steps for the small MLP")
    args = parser.parse_args(argv)
    torch = None if args.no_torch else _load_torch()
    rows = []
    for sizes, batch in CONFIGS:
        _check_same_math(sizes, batch)
        timing = time_config(sizes, batch, args.steps, args.warmup, torch)
        rows.append(dict(model="-".join(map(str, sizes)), batch=batch, **timing))
        print(f"{rows[-1]['model']} batch {batch}: " +
              ", ".join(f"{k} {v:.3f} ms" for k, v in timing.items()), flush=True)
    table = markdown_table(rows, torch is not None)
    print()
    print(table)
    print(f"\ngoal: neural_arch <= {GOAL}x NumPy per step")
    if args.output:
        command = "python " + " ".join(shlex.quote(a) for a in
                                       ["benchmarks/bench_step.py"] + (argv or sys.argv[1:]))
        write_results(args.output, table, command, torch)
        print(f"wrote {args.output}")
    if args.profile:
        profile(CONFIGS[0][0], CONFIGS[0][1], max(args.steps, 20))
    return rows


if __name__ == "__main__":
    main()
