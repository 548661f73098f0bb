"""Activation checkpointing on a GPT: peak activation memory and step time, with and without.

A step is forward, cross-entropy, backward and an SGD update of a GPT (float32, one thread), the
same weights and batch with ``GPTConfig.gradient_checkpointing`` off and on. Memory is measured
with ``tracemalloc`` (NumPy reports its buffers to it) over one step whose model states
(parameters, gradients) exist before tracing starts and are updated in place, so the traced peak
is what the step allocates on top of them: the activations kept for backward and the
temporaries around them. Times are the median of interleaved steps, without tracing.

    python benchmarks/bench_activation_checkpointing.py [--steps 10] [--quick]
        [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from typing import Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_reporting as reporting  # noqa: E402

from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.models import GPT, GPTConfig  # noqa: E402
from neural_arch.optim import SGD  # noqa: E402

MEMORY_GOAL, TIME_GOAL = 0.4, 1.4  # checkpointed / plain: peak activations, step time
SECTION = "bench_activation_checkpointing"  # the marked section of RESULTS.md this script owns
FULL = dict(n_layer=8, n_embd=128, n_head=4, block_size=64, batch=8)
QUICK = dict(n_layer=2, n_embd=32, n_head=2, block_size=16, batch=2)


class Trainer:
    """A GPT, its optimizer and one fixed batch; ``step()`` returns the loss."""

    def __init__(self, size: dict, checkpointing: bool) -> None:
        config = GPTConfig(vocab_size=65, n_layer=size["n_layer"], n_embd=size["n_embd"],
                           n_head=size["n_head"], block_size=size["block_size"],
                           gradient_checkpointing=checkpointing)
        manual_seed(0)  # the same weights for both
        self.model = GPT(config)
        self.params = list(self.model.parameters())
        self.opt = SGD(self.params, lr=1e-3)
        rng = np.random.default_rng(1)
        shape = (size["batch"], size["block_size"])
        self.idx, self.targets = rng.integers(0, 65, shape), rng.integers(0, 65, shape)
        for p in self.params:  # gradients exist from the start and are zeroed in place
            p.grad = np.zeros_like(p.array)

    def step(self, keep_gradients: bool = False) -> float:
        """One training step. The timed steps drop the gradients first (``zero_grad()``'s
        default, as PyTorch's); the traced one zeroes them in place, so that they exist before
        tracing starts and the peak is what the step adds."""
        if keep_gradients:
            for p in self.params:
                p.grad.array.fill(0)
        else:
            self.opt.zero_grad()
        _, loss = self.model(self.idx, self.targets)
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def state_bytes(self) -> int:
        return sum(p.array.nbytes + p.grad.array.nbytes for p in self.params)

    def peak_step_bytes(self) -> int:
        for p in self.params:
            if p.grad is None:
                p.grad = np.zeros_like(p.array)
        tracemalloc.start()
        try:
            self.step(keep_gradients=True)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


def measure(size: dict, steps: int, warmup: int) -> Dict[str, dict]:
    trainers = {"off": Trainer(size, False), "on": Trainer(size, True)}
    first = {name: t.step() for name, t in trainers.items()}  # also creates optimizer state
    if first["on"] != first["off"]:
        raise RuntimeError(f"checkpointing changed the loss: {first['on']} vs {first['off']}")
    results = {name: dict(peak=t.peak_step_bytes(), states=t.state_bytes(), times=[])
               for name, t in trainers.items()}
    names = list(trainers)
    for i in range(warmup + steps):
        for name in names[i % 2:] + names[:i % 2]:  # alternate which one runs first
            start = time.perf_counter()
            trainers[name].step()
            if i >= warmup:
                results[name]["times"].append(time.perf_counter() - start)
    for row in results.values():
        row["ms"] = float(np.median(row.pop("times"))) * 1e3
    return results


def report(size: dict, results: Dict[str, dict], command: str) -> str:
    model = (f"GPT {size['n_layer']} x {size['n_embd']}, T={size['block_size']}, "
             f"B={size['batch']}")
    rows = [[model, name, f"{r['states'] / 2**20:.2f}", f"{r['peak'] / 2**20:.2f}",
             f"{r['ms']:.1f}"] for name, r in results.items()]
    table = reporting.markdown_table(
        ["model", "checkpointing", "model states MiB", "peak activations MiB", "step ms"], rows,
        "llrrr")
    # judged as shown, so a verdict never disagrees with its number
    memory = round(results["on"]["peak"] / results["off"]["peak"], 3)
    step = round(results["on"]["ms"] / results["off"]["ms"], 3)
    goals = reporting.markdown_table(
        ["goal", "measured", "verdict"],
        [[f"peak activations on / off <= {MEMORY_GOAL}", f"{memory:.3f}",
          reporting.verdict(memory <= MEMORY_GOAL)],
         [f"step time on / off <= {TIME_GOAL}", f"{step:.3f}",
          reporting.verdict(step <= TIME_GOAL)]], "lrl")
    head = reporting.section_head(
        "Activation checkpointing (`benchmarks/bench_activation_checkpointing.py`)", command,
        reporting.machine_info(),
        "Peak activations: tracemalloc peak of one training step above the model states, "
        "which exist before tracing starts (gradients zeroed in place). Step: zero_grad() "
        "(gradients dropped, the default), forward, backward, SGD; median over interleaved "
        "steps; float32, one thread.")
    return "\n".join(head + [table, "", goals])


def main(argv: Optional[List[str]] = None) -> Dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a tiny GPT (a smoke run)")
    parser.add_argument("--output", action="append", default=[],
                        help="write or update the results section of this file")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    results = measure(size, args.steps, args.warmup)
    command = reporting.command_line("benchmarks/bench_activation_checkpointing.py",
                                     sys.argv[1:] if argv is None else argv)
    reporting.publish(report(size, results, command), args.output, SECTION)
    return results


if __name__ == "__main__":
    main()
