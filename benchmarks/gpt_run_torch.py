"""torch's run of the GPT that ``python -m neural_arch.train_gpt`` trains: one rank per process.

``bench_gpt_run.py`` starts this script once per rank with train_gpt's own command line after
``--``. It reads that command line with train_gpt's parser (so the defaults are the same: weight
decay, seed, clipping, validation share and batches) and mirrors train_gpt and its ``Trainer``
step for step:

- the same text, tokenizer and windows (``neural_arch.train_gpt.text``), the same vocabulary
  rounding (``model_config``) and the same initial weights: our ``GPT`` built after
  ``manual_seed(seed)`` and copied into nanoGPT in torch (``bench_gpt_step._torch_gpt``);
- the same batches in the same order: neural_arch's ``DistributedSampler`` (pure NumPy; the
  shuffle depends on seed + epoch only) picks each rank's windows, batches of ``--batch-size``;
- torch's DDP on gloo, clipping by the global norm, ``torch.optim.AdamW`` with train_gpt's lr,
  weight decay, betas and eps, the warm-up + decay of ``neural_arch.training.schedule`` written
  as a ``LambdaLR``;
- the Trainer's loop shape: a train record every ``--log-interval`` steps whose timer restarts at
  the record (so validation after a record is timed in the next interval, as in ours), validation
  every ``--eval-interval`` steps and at each epoch end on the first ``--eval-batches`` batches of
  each rank's share of the validation windows, a checkpoint (``torch.save``) at the end.

Rank 0 writes ``metrics.jsonl`` in the Trainer's format into ``--out-dir``. ``run_job`` starts
the ranks and waits for them (the benchmark's entry to this file).

    python benchmarks/gpt_run_torch.py --rank R --world-size W --port P -- TRAIN_GPT_ARGS...
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()  # before NumPy and torch are imported

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

from bench_gpt_step import _free_port, _torch_gpt  # noqa: E402
from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.distributed import DistributedSampler  # noqa: E402
from neural_arch.models import GPT  # noqa: E402
from neural_arch.train_gpt.args import parse as parse_train_gpt  # noqa: E402
from neural_arch.train_gpt.run import model_config  # noqa: E402
from neural_arch.train_gpt.text import Tokenizer, read_text, split_windows  # noqa: E402


def lr_factor(schedule: str, total_steps: int, warmup_steps: int,
              min_lr_ratio: float = 0.0) -> Callable[[int], float]:
    """The multiplier of the base rate for the update after ``k`` earlier ones: the closed form
    of ``neural_arch.training.schedule.build_schedule`` (LinearLR warm-up from 1 / (W + 1), then
    cosine or linear decay over ``total - W`` steps, or constant)."""
    decay_steps = max(1, total_steps - warmup_steps)

    def factor(k: int) -> float:
        if k < warmup_steps:
            return (k + 1) / (warmup_steps + 1)
        done = k - warmup_steps
        if schedule == "cosine":
            cosine = (1 + math.cos(math.pi * done / decay_steps)) / 2
            return min_lr_ratio + (1 - min_lr_ratio) * cosine
        if schedule == "linear":
            return 1.0 + (min_lr_ratio - 1.0) * min(done, decay_steps) / decay_steps
        return 1.0
    return factor


def _refuse_what_is_not_mirrored(args: argparse.Namespace) -> None:
    unsupported = {"--tp": args.tp != 1, "--pp": args.pp != 1, "--zero-stage": args.zero_stage,
                   "--mixed-precision": args.mixed_precision, "--dropout": args.dropout > 0,
                   "--gradient-accumulation-steps": args.gradient_accumulation_steps != 1,
                   "--use-gradient-checkpointing": args.use_gradient_checkpointing,
                   "--resume": args.resume}
    named = [flag for flag, used in unsupported.items() if used]
    if named:
        raise SystemExit(f"gpt_run_torch mirrors plain data-parallel train_gpt runs; it does not "
                         f"mirror {', '.join(named)}")


class _Windows:
    """The (input, target) batch of window indices, as train_gpt's ``TokenWindows`` cuts it."""

    def __init__(self, torch, windows) -> None:
        self.torch, self.tokens, self.block = torch, windows.tokens, windows.block_size
        self.offsets = np.arange(self.block + 1, dtype=np.int64)

    def batch(self, indices: np.ndarray):
        chunks = self.tokens[indices[:, None] * self.block + self.offsets]
        return (self.torch.from_numpy(np.ascontiguousarray(chunks[:, :-1])),
                self.torch.from_numpy(np.ascontiguousarray(chunks[:, 1:])))


class TorchRun:
    def __init__(self, torch, args: argparse.Namespace, rank: int, world: int) -> None:
        self.torch, self.args, self.rank, self.world = torch, args, rank, world
        text = read_text(args.data)
        tokenizer = Tokenizer.from_text(args.tokenizer, text)
        train_set, val_set = split_windows(tokenizer.encode(text), args.max_seq_length,
                                           args.val_fraction)
        self.config = model_config(args, tokenizer)
        manual_seed(args.seed)  # as train_gpt's build_model: every rank the same start
        self.module = _torch_gpt(torch, GPT(self.config), self.config)
        self.model = torch.nn.parallel.DistributedDataParallel(self.module)
        # betas (0.9, 0.999) and eps 1e-8: the defaults of both AdamW classes
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.learning_rate,
                                           weight_decay=args.weight_decay)
        self.train_windows, self.val_windows = _Windows(torch, train_set), _Windows(torch, val_set)
        self.sampler = DistributedSampler(len(train_set), num_replicas=world, rank=rank,
                                          shuffle=True, seed=args.seed)
        self.val_indices = DistributedSampler(len(val_set), num_replicas=world, rank=rank,
                                              shuffle=False, seed=args.seed).indices()
        steps_per_epoch = -(-len(self.sampler) // args.batch_size)
        self.total = args.epochs * steps_per_epoch
        if args.max_steps is not None:
            self.total = min(self.total, args.max_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(args.lr_schedule, self.total, args.warmup_steps))
        self.step = 0
        self.metrics = None
        if rank == 0:
            os.makedirs(args.out_dir, exist_ok=True)
            self.metrics = open(os.path.join(args.out_dir, "metrics.jsonl"), "w",
                                encoding="utf-8", buffering=1)

    def _sum_over_ranks(self, values: np.ndarray) -> np.ndarray:
        tensor = self.torch.from_numpy(np.asarray(values, dtype=np.float64).copy())
        self.torch.distributed.all_reduce(tensor)
        return tensor.numpy()

    def _record(self, kind: str, values: Dict[str, object], elapsed: float) -> None:
        if self.metrics is None:
            return
        record = dict({"kind": kind, "step": self.step}, **values, time=round(elapsed, 3))
        self.metrics.write(json.dumps(record) + "\n")
        shown = [f"{key} {values[key]:.4f}" for key in ("loss", "train_loss", "val_loss")
                 if isinstance(values.get(key), float)]
        if "lr" in values:
            shown += [f"lr {values['lr']:.2e}", f"{values['tokens_per_second']:,.0f} tok/s"]
        print(f"[torch] {kind} step {self.step}/{self.total} | {' | '.join(shown)}", flush=True)

    def evaluate(self) -> float:
        """Mean loss of the first --eval-batches batches of each rank's validation share."""
        sums = np.zeros(2)
        self.module.eval()
        batch = self.args.batch_size
        with self.torch.no_grad():
            for number, begin in enumerate(range(0, len(self.val_indices), batch)):
                if self.args.eval_batches is not None and number >= self.args.eval_batches:
                    break
                indices = self.val_indices[begin:begin + batch]
                loss = self.module(*self.val_windows.batch(indices))
                sums += (float(loss.item()) * len(indices), len(indices))
        self.module.train()
        sums = self._sum_over_ranks(sums)
        return float(sums[0] / sums[1])

    def _save(self) -> None:
        if self.rank == 0:
            self.torch.save({"model": self.module.state_dict(),
                             "optimizer": self.optimizer.state_dict(),
                             "scheduler": self.scheduler.state_dict(), "step": self.step},
                            os.path.join(self.args.out_dir, "checkpoint.pt"))

    def _train_record(self, interval: np.ndarray, since: float) -> Dict[str, float]:
        sums = self._sum_over_ranks(interval)
        seconds = max(time.perf_counter() - since, 1e-9)
        return {"loss": float(sums[0] / sums[1]),
                "lr": float(self.optimizer.param_groups[0]["lr"]),
                "samples_per_second": float(sums[1] / seconds),
                "tokens_per_second": float(sums[1] * self.args.max_seq_length / seconds)}

    def fit(self) -> None:
        args, torch = self.args, self.torch
        clip, saved = args.gradient_clip_norm, -1
        start = time.perf_counter()
        interval, interval_start = np.zeros(2), time.perf_counter()  # loss * samples, samples
        epoch = 0
        while epoch < args.epochs and self.step < self.total:
            self.sampler.set_epoch(epoch)
            order, epoch_sums = self.sampler.indices(), np.zeros(2)
            epoch_start, steps_before = time.perf_counter(), self.step
            finished = True
            for begin in range(0, len(order), args.batch_size):
                indices = order[begin:begin + args.batch_size]
                self.optimizer.zero_grad()
                loss = self.model(*self.train_windows.batch(indices))
                loss.backward()  # DDP averages the gradients over the ranks here
                if clip:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
                self.optimizer.step()
                value = float(loss.item())
                epoch_sums += (value * len(indices), len(indices))
                interval += (value * len(indices), len(indices))
                self.step += 1
                self.scheduler.step()
                if self.step % args.log_interval == 0 or self.step == self.total:
                    values = self._train_record(interval, interval_start)
                    interval[:], interval_start = 0, time.perf_counter()
                    self._record("train", dict(values, epoch=epoch), time.perf_counter() - start)
                if args.eval_interval and self.step % args.eval_interval == 0:
                    self._record("val", {"val_loss": self.evaluate(), "epoch": epoch},
                                 time.perf_counter() - start)
                if args.save_interval and self.step % args.save_interval == 0:
                    self._save()
                    saved = self.step
                if self.step >= self.total:
                    finished = False  # as the Trainer: a run stopped by steps ends no epoch
                    break
            if not finished:
                break
            sums = self._sum_over_ranks(epoch_sums)
            seconds = time.perf_counter() - epoch_start
            self._record("epoch", {"epoch": epoch, "train_loss": float(sums[0] / sums[1]),
                                   "val_loss": self.evaluate(), "seconds": seconds,
                                   "steps": self.step - steps_before},
                         time.perf_counter() - start)
            epoch += 1
        if saved != self.step:
            self._save()
        if self.metrics is not None:
            self.metrics.close()


def rank_environment() -> Dict[str, str]:
    """This environment, with one BLAS thread and the repository importable (also for ours)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{name: "1" for name in common.THREAD_VARS})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [common.ROOT, env.get("PYTHONPATH")]))
    return env


def run_job(train_gpt_argv: List[str], world: int, timeout: float) -> float:
    """Wall seconds of this script's run on ``world`` ranks (one process each, gloo)."""
    port = _free_port()
    start = time.perf_counter()
    ranks = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(rank),
                               "--world-size", str(world), "--port", str(port), "--",
                               *train_gpt_argv], env=rank_environment(), cwd=common.ROOT)
             for rank in range(world)]
    codes: List[Optional[int]] = [None] * world
    try:
        while any(code is None for code in codes):
            codes = [rank.poll() for rank in ranks]
            if any(code not in (None, 0) for code in codes):
                break  # one rank failed: the others would wait for it forever
            if time.perf_counter() - start > timeout:
                break
            time.sleep(0.05)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    seconds = time.perf_counter() - start
    if codes != [0] * world:
        raise common.JobFailed(f"torch's run failed after {seconds:.0f} s (time limit "
                               f"{timeout:.0f} s): exit codes of the ranks {codes}")
    return seconds


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True, help="gloo's rendezvous on 127.0.0.1")
    parser.add_argument("train_gpt_args", nargs=argparse.REMAINDER,
                        help="after --: train_gpt's command line")
    args = parser.parse_args(argv)
    if args.train_gpt_args[:1] == ["--"]:
        args.train_gpt_args = args.train_gpt_args[1:]
    return args


def main(argv: Optional[List[str]] = None) -> int:
    import torch
    torch.set_num_threads(1)
    own = parse_args(argv)
    args = parse_train_gpt(own.train_gpt_args)
    _refuse_what_is_not_mirrored(args)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{own.port}", rank=own.rank,
        world_size=own.world_size)
    try:
        TorchRun(torch, args, own.rank, own.world_size).fit()
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: gloo's threads, destroyed there, have once
    # aborted a finished run ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
