"""Time one training step of TabGPT: neural_arch against the same model in PyTorch on the CPU.

A step is zero_grad, forward, the loss, backward and an AdamW update, in float32 on one
thread: a classification step (cross-entropy on the [CLS] head), a masked-cell pretraining
step (the same fixed cell mask in both) and a pretraining step with SCARF's contrastive view
as well (the same fixed corruption in both). The torch model is the tests' twin of TabGPT
(``tests/models/tabgpt/tabgpt_torch_reference.py``) loaded with neural_arch's weights; the first
step's losses must agree to 1e-4, or the run stops. Dropout is off, so that they can. Steps of
the two are interleaved (the order alternates) so that machine noise hits them alike; each
reports the median. The rows are a mixed table: numbers with missing cells and categories.

    python benchmarks/bench_tabgpt_step.py [--steps 20] [--warmup 3] [--quick]
        [--output FILE]
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "tests", "models", "tabgpt")]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()  # before NumPy and torch are imported

import argparse  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

import bench_reporting as reporting  # noqa: E402

from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.models.tabgpt import (TabGPTConfig, TabGPTForPreTraining,  # noqa: E402
                                       TabGPTForSequenceClassification)
from neural_arch.models.tabgpt.scarf import sample_corruption  # noqa: E402
from neural_arch.optim import AdamW  # noqa: E402

GOAL = 1.2  # neural_arch / torch step time
SECTION = "bench_tabgpt_step"
LR, WEIGHT_DECAY = 1e-3, 1e-5
CARDINALITIES = [10, 5, 20, 3]
# (numeric columns, d_token, layers, heads, batch): the FT-Transformer's default size, a small one
CONFIGS = [(8, 192, 3, 8, 256), (8, 64, 2, 4, 128)]
QUICK = [(3, 16, 1, 2, 16)]
KINDS = ("classification", "pretraining", "contrastive")


def _config(sizes, kind: str) -> TabGPTConfig:
    n_numerical, d_token, layers, heads, _ = sizes
    return TabGPTConfig(n_numerical=n_numerical, categorical_cardinalities=CARDINALITIES,
                        d_token=d_token, n_layers=layers, n_heads=heads, num_labels=3,
                        attention_dropout=0.0, ffn_dropout=0.0,
                        contrastive_weight=1.0 if kind == "contrastive" else 0.0)


def _rows(config: TabGPTConfig, batch: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    x_num = rng.standard_normal((batch, config.n_numerical)).astype(np.float32)
    x_num[rng.random(x_num.shape) < 0.05] = np.nan
    x_cat = np.stack([rng.integers(0, c, batch) for c in CARDINALITIES], axis=1)
    x_cat[rng.random(x_cat.shape) < 0.05] = -1
    labels = rng.integers(0, config.num_labels, batch)
    cell_mask = rng.random((batch, config.n_features)) < config.mask_probability
    corruption = sample_corruption(batch, config.n_features, config.corruption_rate, rng)
    return x_num, x_cat, labels, cell_mask, corruption


class Pair:
    """The same TabGPT, rows and optimizer in neural_arch and in torch."""

    def __init__(self, torch, sizes, kind: str) -> None:
        import tabgpt_torch_reference as reference
        self.kind, config = kind, _config(sizes, kind)
        self.pretraining = kind != "classification"
        manual_seed(0)
        model_class = TabGPTForPreTraining if self.pretraining \
            else TabGPTForSequenceClassification
        self.ours = model_class(config)
        self.opt = AdamW(self.ours.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        torch_class = reference.PreTraining if self.pretraining else reference.Classifier
        self.theirs = reference.load_from(torch_class(config), self.ours, torch.float32)
        self.topt = torch.optim.AdamW(self.theirs.parameters(), lr=LR,
                                      weight_decay=WEIGHT_DECAY)
        self.x_num, self.x_cat, self.labels, self.cell_mask, corruption = _rows(config,
                                                                                 sizes[-1])
        self.corruption = corruption if kind == "contrastive" else None
        self.tensors = [torch.from_numpy(a) for a in (self.x_num, self.x_cat, self.labels,
                                                      self.cell_mask)]
        self.source_rows = None if self.corruption is None else \
            torch.from_numpy(corruption.source_rows)

    def ours_step(self) -> float:
        self.opt.zero_grad()
        if self.pretraining:
            loss = self.ours(self.x_num, self.x_cat, cell_mask=self.cell_mask,
                             corruption=self.corruption).loss
        else:
            loss = self.ours(self.x_num, self.x_cat, labels=self.labels).loss
        loss.backward()
        self.opt.step()
        return float(loss.item())

    def torch_step(self) -> float:
        x_num, x_cat, labels, cell_mask = self.tensors
        self.topt.zero_grad()
        if self.pretraining:
            loss, _ = self.theirs(x_num, x_cat, cell_mask, self.source_rows)
        else:
            _, loss = self.theirs(x_num, x_cat, labels)
        loss.backward()
        self.topt.step()
        return float(loss.item())


def time_pair(pair: Pair, steps: int, warmup: int) -> Dict[str, float]:
    """Median ms per step of each, after checking that the first steps' losses agree."""
    first, theirs = pair.ours_step(), pair.torch_step()
    if abs(first - theirs) > 1e-4 * max(1.0, abs(theirs)):
        raise RuntimeError(f"the models disagree on the first loss ({pair.kind}): neural_arch "
                           f"{first:.6f}, torch {theirs:.6f}")
    runners: Dict[str, Callable[[], float]] = {"neural_arch": pair.ours_step,
                                               "torch": pair.torch_step}
    return common.interleaved_step_ms(runners, steps, warmup)


def report(rows: List[dict], command: str, machine: str, torch_version: str) -> str:
    table, misses = [], 0
    for r in rows:
        ratio = round(r["neural_arch"] / r["torch"], 3)  # judged as shown
        misses += ratio > GOAL
        table.append([f"{r['numerical']}+{len(CARDINALITIES)} columns, d {r['d_token']}, "
                      f"{r['layers']} x {r['heads']} heads, B {r['batch']}", r["kind"],
                      f"{r['neural_arch']:.2f}", f"{r['torch']:.2f}", f"{ratio:.3f}",
                      reporting.verdict(ratio <= GOAL)])
    head = reporting.section_head(
        "TabGPT training step against PyTorch (`benchmarks/bench_tabgpt_step.py`)", command,
        f"{machine}; torch {torch_version}",
        "A step: zero_grad, forward, loss, backward, AdamW; float32, one thread, dropout off; "
        "the median of interleaved steps after a warm-up, the first step's losses checked "
        "equal. The torch model is the tests' twin of TabGPT with the same weights.")
    body = reporting.markdown_table(
        ["TabGPT", "step", "neural_arch ms", "torch ms", "neural_arch / torch",
         f"<= {GOAL}"], table, "llrrrl")
    return "\n".join(head + [body, "", f"goal: neural_arch <= {GOAL}x torch's step time; "
                                       f"{misses} of {len(rows)} row(s) miss it."])


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS), help="some of " + ",".join(KINDS))
    parser.add_argument("--quick", action="store_true", help="a tiny TabGPT (a smoke run)")
    parser.add_argument("--output", action="append", default=[],
                        help="also write the table into this markdown file's section")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_tabgpt_step needs torch (the peer it measures against): pip install torch")
        return 1
    torch.set_num_threads(1)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        raise SystemExit(f"--kinds takes some of {', '.join(KINDS)}, got {args.kinds!r}")
    machine = common.machine_info()
    command = common.command_line("benchmarks/bench_tabgpt_step.py",
                                  sys.argv[1:] if argv is None else argv)
    rows = []
    for sizes in (QUICK if args.quick else CONFIGS):
        for kind in kinds:
            timed = time_pair(Pair(torch, sizes, kind), args.steps, args.warmup)
            rows.append(dict(zip(("numerical", "d_token", "layers", "heads", "batch"), sizes),
                             kind=kind, **timed))
            print(rows[-1], flush=True)
    reporting.publish(report(rows, command, machine, torch.__version__), args.output, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
