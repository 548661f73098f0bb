"""A real training run: the char GPT on a 1 MB text at p = 2, neural_arch against torch.

Ours is ``python -m neural_arch.train_gpt`` under our launcher (2 ranks, one BLAS thread each);
torch's is the same run written in torch (``gpt_run_torch.py``: nanoGPT from the same initial
weights, torch's DDP on gloo, AdamW with the same rate, decay, clipping and warm-up + cosine
schedule, the same windows in the same order, validation at the same steps on the same
windows). The two runs go one after the other, each with the machine's cores to itself.

Measured per run, from its ``metrics.jsonl``: the steady throughput, i.e. the tokens of the
train intervals over their seconds (the Trainer's timer of a "train" record restarts at the
previous record, so an interval also holds any validation or epoch end that followed that
record; such intervals are left out, and the first one, which pays one-time start-up costs);
the whole run's wall time (process start to exit, everything included) and tokens/s over it;
the train loss at the first record and at the end, the last validation loss. The text is
``scripts/make_corpus.py``'s (about 1.1 MB of Python's own documentation; it depends on the
Python version). The default --steps 6900 is sized for about 10 minutes of ours on 2 cores
(a step of this GPT at p = 2 took about 85 ms of ours and 112 ms of torch's in this
benchmark's own run): with torch's run after it, the benchmark takes about 25 minutes.

    python benchmarks/bench_gpt_run.py [--steps 6900] [--torch-steps N] [--eval-interval 250]
        [--log-interval 50] [--corpus PATH] [--out-dir runs/bench_gpt_run] [--quick]
        [--output benchmarks/RESULTS.md] [--chart docs/training_run_1mb.png]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()  # this process and, through the environment, every rank

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import bench_reporting as reporting  # noqa: E402
import gpt_run_torch as torch_run  # noqa: E402

SECTION = "bench_gpt_run"
WORLD = 2
# the char GPT of the training program (and of bench_gpt_step's first row), and a tiny one for
# smoke runs
FULL = dict(hidden=128, heads=4, layers=4, block=64, batch=16, steps=6900, warmup=100,
            eval_interval=250, log_interval=50)
QUICK = dict(hidden=32, heads=2, layers=2, block=16, batch=4, steps=30, warmup=5,
             eval_interval=10, log_interval=1)
QUICK_CHARS = 100_000  # the start of the corpus: enough windows for a few steps
LEARNING_RATE = "3e-3"


def train_gpt_argv(sizes: Dict[str, int], corpus: str, steps: int, eval_interval: int,
                   log_interval: int, out_dir: str) -> List[str]:
    """train_gpt's command line of a run; torch's run reads the same one."""
    return ["--data", corpus, "--hidden-size", str(sizes["hidden"]),
            "--attention-heads", str(sizes["heads"]), "--layers", str(sizes["layers"]),
            "--max-seq-length", str(sizes["block"]), "--batch-size", str(sizes["batch"]),
            "--learning-rate", LEARNING_RATE, "--lr-schedule", "cosine",
            "--warmup-steps", str(sizes["warmup"]), "--max-steps", str(steps),
            "--epochs", "1000", "--eval-interval", str(eval_interval),
            "--log-interval", str(log_interval),
            # one checkpoint, at the last step: after the last train interval
            "--save-interval", str(steps), "--no-progress", "--out-dir", out_dir]


def run_ours(argv: List[str], timeout: float) -> float:
    """Wall seconds of train_gpt at p = WORLD under our launcher."""
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher",
           f"--nproc_per_node={WORLD}", "--standalone", "--timeout", str(int(timeout)),
           "-m", "neural_arch.train_gpt", *argv]
    start = time.perf_counter()
    code = subprocess.run(cmd, env=torch_run.rank_environment(), cwd=common.ROOT).returncode
    seconds = time.perf_counter() - start
    if code != 0:
        raise common.JobFailed(f"neural_arch's run exited with code {code} after "
                               f"{seconds:.0f} s (time limit {timeout:.0f} s)")
    return seconds


def run_torch(argv: List[str], timeout: float) -> float:
    return torch_run.run_job(argv, WORLD, timeout)


def tokens_between(train_windows: int, batch: int, block: int) -> Callable[[int, int], int]:
    """Tokens of all ranks in steps a+1..b: every step has ``batch`` windows per rank but the
    last of each epoch (the ``DistributedSampler`` gives each rank ceil(n / p) windows)."""
    per_rank = -(-train_windows // WORLD)
    per_epoch = -(-per_rank // batch)
    short = per_epoch * batch - per_rank  # windows the epoch's last batch lacks

    def tokens(a: int, b: int) -> int:
        epoch_ends = b // per_epoch - a // per_epoch
        return ((b - a) * batch - epoch_ends * short) * WORLD * block
    return tokens


def summarize(records: List[dict], steps: int, wall: float,
              tokens: Callable[[int, int], int]) -> Dict[str, object]:
    train = [r for r in records if r["kind"] == "train"]
    if not train or train[-1]["step"] != steps:
        raise RuntimeError(f"the run's last train record is at step "
                           f"{train[-1]['step'] if train else None}, expected {steps}")
    # work after step s (validation, epoch end) is timed in the interval (a, b] with a <= s < b
    busy = [r["step"] for r in records if r["kind"] in ("val", "epoch")]
    kept_tokens, kept_seconds, kept_steps, previous = 0, 0.0, 0, 0
    for index, record in enumerate(train):
        a, b = previous, record["step"]
        previous = b
        if index == 0 or any(a <= s < b for s in busy):
            continue
        interval = tokens(a, b)
        kept_tokens += interval
        kept_seconds += interval / record["tokens_per_second"]
        kept_steps += b - a
    if not kept_steps:
        raise RuntimeError(f"no train interval of {steps} steps is free of validation: use "
                           f"more --steps or a larger --eval-interval")
    vals = [(r["step"], r["val_loss"]) for r in records if r["kind"] in ("val", "epoch")
            and r.get("val_loss") is not None]
    return {"steps": steps, "seconds": wall, "steady_tps": kept_tokens / kept_seconds,
            "steady_ms": 1e3 * kept_seconds / kept_steps, "steady_steps": kept_steps,
            "overall_tps": tokens(0, steps) / wall, "first": (train[0]["step"], train[0]["loss"]),
            "final_train": train[-1]["loss"], "final_val": vals[-1] if vals else None,
            "records": records}


def read_metrics(out_dir: str) -> List[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def describe_data(argv: List[str]) -> Dict[str, object]:
    """What train_gpt builds from this command line: windows, vocabulary, parameters."""
    from neural_arch.models import GPT
    from neural_arch.train_gpt.args import parse
    from neural_arch.train_gpt.run import model_config
    from neural_arch.train_gpt.text import Tokenizer, read_text, split_windows
    args = parse(argv)
    text = read_text(args.data)
    tokenizer = Tokenizer.from_text(args.tokenizer, text)
    train, val = split_windows(tokenizer.encode(text), args.max_seq_length, args.val_fraction)
    config = model_config(args, tokenizer)
    params = sum(p.array.size for p in GPT(config).parameters())
    return {"bytes": os.path.getsize(args.data), "characters": len(text),
            "distinct": tokenizer.vocab_size, "vocab": config.vocab_size,
            "train_windows": len(train), "val_windows": len(val), "parameters": params,
            "eval_batches": args.eval_batches}


def _row(name: str, s: Dict[str, object]) -> List[str]:
    val = s["final_val"]
    return [name, s["steps"], f"{s['seconds'] / 60:.2f}", f"{s['steady_tps']:,.0f}",
            f"{s['steady_ms']:.1f}", f"{s['overall_tps']:,.0f}", f"{s['first'][1]:.4f}",
            f"{s['final_train']:.4f}", f"{val[1]:.4f} @ {val[0]}" if val else "n/a"]


def report(ours: Dict[str, object], theirs: Dict[str, object], data: Dict[str, object],
           sizes: Dict[str, int], intervals: Dict[str, int], command: str, machine: str,
           torch_version: str, chart: Optional[str]) -> str:
    head = reporting.section_head(
        "A real GPT training run against PyTorch (`benchmarks/bench_gpt_run.py`)", command,
        f"{machine}; torch {torch_version}",
        f"The text: `scripts/make_corpus.py` ({data['bytes']:,} bytes, {data['characters']:,} "
        f"characters, {data['distinct']} distinct; vocabulary {data['vocab']}, ln V = "
        f"{math.log(data['vocab']):.3f}); {data['train_windows']:,} training and "
        f"{data['val_windows']:,} validation windows of {sizes['block']} tokens. The GPT: "
        f"{sizes['layers']} layers, {sizes['heads']} heads, width {sizes['hidden']} "
        f"({data['parameters']:,} parameters); p = {WORLD}, {sizes['batch']} windows per rank "
        f"and step, AdamW at {LEARNING_RATE} with {sizes['warmup']} warm-up steps and cosine "
        f"decay, clipping at norm 1; validation every {intervals['eval']} steps and at each "
        f"epoch end on {data['eval_batches']} batches per rank. neural_arch: `python -m "
        f"neural_arch.train_gpt` under our launcher (our DDP, `--backend auto`); torch: the "
        f"same run in `benchmarks/gpt_run_torch.py` (nanoGPT from the same initial weights, "
        f"DDP on gloo, the same windows in the same order); one thread per rank; the runs one "
        f"after the other. Steady: tokens over seconds of the train intervals "
        f"({intervals['log']} steps each) without validation, epoch ends or the first "
        f"(start-up) interval; "
        f"overall: all tokens over the wall time from process start to exit.")
    table = reporting.markdown_table(
        ["run", "steps", "minutes", "steady tokens/s", "steady ms/step", "overall tokens/s",
         f"train loss at step {ours['first'][0]}", "final train loss", "final val loss @ step"],
        [_row("neural_arch", ours), _row(f"torch {torch_version}", theirs)])
    lines = head + [table, "",
                    f"neural_arch / torch tokens/s: steady "
                    f"{ours['steady_tps'] / theirs['steady_tps']:.3f}, overall "
                    f"{ours['overall_tps'] / theirs['overall_tps']:.3f}."]
    if chart:
        lines += ["", f"Loss curves: `{_shown_path(chart)}`."]
    return "\n".join(lines)


def _shown_path(path: str) -> str:
    """Relative to the repository when inside it: no machine-specific folders in reports."""
    full = os.path.abspath(path)
    inside = os.path.commonpath([full, common.ROOT]) == common.ROOT
    return os.path.relpath(full, common.ROOT) if inside else os.path.basename(full)


def draw(runs: Dict[str, Dict[str, object]], path: str, title: str) -> None:
    plt = reporting.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for color, (name, summary) in zip(("C0", "C1"), runs.items()):
        train = [r for r in summary["records"] if r["kind"] == "train"]
        vals = [r for r in summary["records"] if r["kind"] == "val"]
        for axis, x in ((axes[0], "step"), (axes[1], "time")):
            scale = 1 / 60 if x == "time" else 1
            axis.plot([r[x] * scale for r in train], [r["loss"] for r in train], color=color,
                      alpha=0.6, label=f"{name} train")
            axis.plot([r[x] * scale for r in vals], [r["val_loss"] for r in vals], "o--",
                      color=color, markersize=3, label=f"{name} validation")
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("minutes since the training loop started")
    axes[0].set_ylabel("cross-entropy (nats per character)")
    for axis in axes:
        axis.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    reporting.save_figure(fig, path)


def prepare_corpus(args: argparse.Namespace, out_dir: str) -> str:
    if args.corpus:
        return os.path.abspath(args.corpus)
    path = os.path.join(out_dir, "corpus.txt")
    script = os.path.join(common.ROOT, "scripts", "make_corpus.py")
    # its own process: it imports the whole standard library, which should not stay in ours
    cmd = [sys.executable, script, "--out", path] + (["--min-bytes", "0"] if args.quick else [])
    subprocess.run(cmd, check=True, cwd=common.ROOT)
    if args.quick:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(QUICK_CHARS)
        path = os.path.join(out_dir, "corpus_quick.txt")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    return path


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None,
                        help=f"steps of ours (default {FULL['steps']}: about 10 minutes at "
                             f"p = 2 on 2 cores; --quick {QUICK['steps']})")
    parser.add_argument("--torch-steps", type=int, default=None, help="default: --steps")
    parser.add_argument("--eval-interval", type=int, default=None,
                        help=f"default {FULL['eval_interval']} (--quick {QUICK['eval_interval']})")
    parser.add_argument("--log-interval", type=int, default=None,
                        help=f"default {FULL['log_interval']} (--quick {QUICK['log_interval']})")
    parser.add_argument("--corpus", default=None, help="default: make_corpus.py into --out-dir")
    parser.add_argument("--out-dir", default=os.path.join("runs", "bench_gpt_run"))
    parser.add_argument("--quick", action="store_true", help="a tiny GPT, a few steps, 100 KB")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    parser.add_argument("--output", action="append", default=[])
    parser.add_argument("--chart", default=None, help="PNG of both runs' loss curves")
    args = parser.parse_args(argv)
    args.worker = None  # entry_point's convention; this benchmark starts its ranks itself
    for name in ("steps", "torch_steps", "eval_interval", "log_interval"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    try:
        import torch
    except ImportError:
        print("bench_gpt_run needs torch (the peer it measures against): pip install torch")
        return 1
    sizes = QUICK if args.quick else FULL
    steps = args.steps or sizes["steps"]
    torch_steps = args.torch_steps or steps
    eval_interval = args.eval_interval or sizes["eval_interval"]
    log_interval = args.log_interval or sizes["log_interval"]
    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    corpus = prepare_corpus(args, out_dir)
    summaries, data = {}, None
    for name, run, count in (("neural_arch", run_ours, steps), ("torch", run_torch, torch_steps)):
        run_dir = os.path.join(out_dir, name)
        shutil.rmtree(run_dir, ignore_errors=True)  # no checkpoints or metrics of an earlier run
        argv = train_gpt_argv(sizes, corpus, count, eval_interval, log_interval, run_dir)
        data = data or describe_data(argv)
        print(f"== {name}: {count} steps at p = {WORLD}", flush=True)
        wall = run(argv, args.timeout)
        summaries[name] = summarize(read_metrics(run_dir), count, wall, tokens_between(
            data["train_windows"], sizes["batch"], sizes["block"]))
    if args.chart:
        draw(summaries, args.chart, f"char GPT {sizes['layers']} x {sizes['hidden']} on "
             f"{data['bytes'] / 1e6:.2f} MB at p = {WORLD}: neural_arch and torch "
             f"{torch.__version__}")
    reporting.publish(report(summaries["neural_arch"], summaries["torch"], data, sizes,
                             dict(eval=eval_interval, log=log_interval), command, machine,
                             torch.__version__, args.chart), args.output, SECTION)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_gpt_run.py", parse_args, None, drive)


if __name__ == "__main__":
    sys.exit(main())
