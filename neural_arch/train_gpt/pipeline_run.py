"""Training with ``--pp > 1``: a ``GPT3D`` on a (dp, tp, pp) device mesh, in a loop of its own.

The Trainer's step is ``AdvancedDistributedDataParallel``'s, which knows nothing of pipeline
stages, so this loop drives ``GPT3D.train_step`` instead and writes what the Trainer writes:
the same ``metrics.jsonl`` records (``grad_norm`` is the whole model's, which GPT3D clips by;
``comm_seconds`` is null: the pipeline's messages are not timed), the same progress lines and
summary on rank 0 (``training.progress``), the same learning-rate schedules
(``training.schedule``), validation every ``--eval-interval`` steps and at each epoch's end,
a checkpoint every ``--save-interval`` steps and at the end (``pipeline_checkpoints``).

Every rank builds the dense GPT's weights from ``--seed`` (the --pp 1 run's start) and reads
the same global batches (``pipeline_data``): the losses follow the --pp 1 run's.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable, Dict, Optional

import numpy as np

from ..core import manual_seed
from ..distributed import get_rank, get_world_size, init_device_mesh
from ..distributed.parallel3d import GPT3D
from ..models.gpt import GPTConfig
from ..training.callbacks import History
from ..training.metrics import MetricsLogger, epoch_record, write_record
from ..training.progress import Progress
from ..training.schedule import build_schedule
from .args import INTERLEAVED_CHUNKS, UsageError
from .pipeline_checkpoints import PipelineCheckpoints
from .pipeline_data import GlobalBatches
from .run import save_run
from .text import Tokenizer, TokenWindows


def build_pipeline_model(args: argparse.Namespace, config: GPTConfig) -> GPT3D:
    world, tp, pp = get_world_size(), args.tp, args.pp
    if world % (tp * pp):
        raise UsageError(f"--tp {tp} x --pp {pp} does not divide the world size {world}")
    mesh = init_device_mesh((world // (tp * pp), tp, pp), mesh_dim_names=("dp", "tp", "pp"))
    manual_seed(args.seed)  # every rank cuts its piece from the dense weights of this seed
    return GPT3D(config, mesh, args.microbatches, schedule=args.pp_schedule,
                 chunks=INTERLEAVED_CHUNKS,
                 data_parallel="zero1" if args.zero_stage == 1 else "ddp",
                 max_grad_norm=args.gradient_clip_norm or None, lr=args.learning_rate,
                 weight_decay=args.weight_decay)


def train_pipeline(args: argparse.Namespace, config: GPTConfig, tokenizer: Tokenizer,
                   train_set: TokenWindows, val_set: TokenWindows,
                   out_dir: str) -> Dict[str, Any]:
    model = build_pipeline_model(args, config)
    batches = GlobalBatches(train_set, args.batch_size, model.dp, args.microbatches,
                            shuffle=True, seed=args.seed)
    if not len(batches):
        raise UsageError(f"--data {args.data}: {len(train_set)} training windows make no batch "
                         f"of --batch-size {args.batch_size} for each of {model.dp} "
                         f"data-parallel ranks")
    # validation needs only the dp split: evaluate runs each replica's rows whole
    val = GlobalBatches(val_set, args.batch_size, model.dp, 1, shuffle=False,
                        seed=args.seed) if len(val_set) else None
    if get_rank() == 0:
        held = sum(int(np.asarray(p.data).size) for p in model.params)
        print(f"GPT: {held:,} parameters on rank 0 (pipeline stage 0, tensor-parallel shard "
              f"0), vocab {config.vocab_size} ({args.tokenizer}), {len(train_set)} training "
              f"windows of {args.max_seq_length} tokens; world {get_world_size()} = {model.dp} "
              f"data-parallel x {model.tp} tensor-parallel x {model.pp} pipeline stages "
              f"({args.pp_schedule}, {args.microbatches} micro-batches)", flush=True)
    loop = PipelineLoop(args, model, batches, val, out_dir,
                        on_start=lambda: save_run(out_dir, tokenizer, config, args))
    history = loop.fit()
    return {"history": history.state_dict(), "steps": model.steps}


class PipelineLoop:
    """The Trainer's loop (records, validation, checkpoints, resume) around GPT3D's step."""

    def __init__(self, args: argparse.Namespace, model: GPT3D, batches: GlobalBatches,
                 val: Optional[GlobalBatches], out_dir: str,
                 on_start: Callable[[], None] = lambda: None) -> None:
        self.args, self.model, self.batches, self.val = args, model, batches, val
        self.out_dir, self.on_start = out_dir, on_start
        self.checkpoints = PipelineCheckpoints(os.path.join(out_dir, "checkpoints"), model)
        self.is_logger = get_rank() == 0
        self.history = History("val_loss")
        self.epoch = self.position = 0      # epochs done; batches of this epoch used
        self.epoch_sums = np.zeros(2)       # loss * samples, samples of this epoch
        self.elapsed = 0.0                  # seconds of earlier runs (resume)
        self.saved_step = -1

    # ------------------------------------------------------------------ the loop
    def fit(self) -> History:
        args, model = self.args, self.model
        total = args.epochs * len(self.batches)
        total = total if args.max_steps is None else min(total, args.max_steps)
        scheduler = build_schedule(model.optimizer, args.lr_schedule, total, args.warmup_steps)
        resumed = self._resume(scheduler) if args.resume else False
        self.on_start()  # after the resume: a checkpoint that does not load changes no file
        logger = MetricsLogger(self.out_dir, append=resumed) if self.is_logger else None
        bar = Progress(total, model.steps, enabled=self.is_logger and not args.no_progress,
                       verbose=self.is_logger)
        start = time.perf_counter() - self.elapsed
        interval, interval_start = np.zeros(2), time.perf_counter()  # loss * samples, samples
        last_loss = float("nan")
        try:
            # a resumed run may already have done max_steps: then it only saves and reports
            while self.epoch < args.epochs and (args.max_steps is None
                                                or model.steps < args.max_steps):
                epoch_start, steps_before = time.perf_counter(), model.steps
                for idx, targets in self.batches.epoch(self.epoch, skip=self.position):
                    last_loss = model.train_step(idx, targets)
                    rows = idx.shape[0]
                    self.epoch_sums += (last_loss * rows, rows)
                    interval += (last_loss * rows, rows)
                    self.position += 1
                    if scheduler is not None:
                        scheduler.step()
                    step = model.steps
                    logs: Dict[str, Any] = {"step": step, "epoch": self.epoch + 1}
                    if step % args.log_interval == 0 or step == total:
                        seconds = max(time.perf_counter() - interval_start, 1e-9)
                        logs.update(self._interval_record(interval, seconds))
                        self.history.samples += float(interval[1])
                        self.history.last_loss = logs["loss"]
                        interval, interval_start = np.zeros(2), time.perf_counter()
                        self._record(logger, bar, "train", logs, time.perf_counter() - start)
                    if args.eval_interval and self.val is not None \
                            and step % args.eval_interval == 0:
                        self._record(logger, bar, "val",
                                     dict(self.evaluate(), epoch=self.epoch + 1),
                                     time.perf_counter() - start)
                    bar.advance(logs.get("loss"))
                    if args.save_interval and step % args.save_interval == 0:
                        self.elapsed = time.perf_counter() - start
                        self.save()
                    if args.max_steps is not None and step >= args.max_steps:
                        break
                else:  # the epoch ran to its end
                    self._end_epoch(epoch_start, steps_before, logger, bar, start)
                    continue
                break  # max_steps reached inside the epoch
            self.elapsed = time.perf_counter() - start
            self.history.total_time, self.history.steps = self.elapsed, model.steps
            self.save()
            bar.summary(self.history, model.dp, args.max_seq_length)
        finally:
            bar.close()
            if logger is not None:
                logger.close()
        return self.history

    def evaluate(self) -> Dict[str, Optional[float]]:
        """The validation loss over the first ``--eval-batches`` global batches (accuracy is
        not computed: the logits stay split over the last stage's tp ranks)."""
        sums = np.zeros(2)
        for index, (idx, targets) in enumerate(self.val.epoch(0)):
            if index >= self.args.eval_batches:
                break
            sums += (self.model.evaluate(idx, targets) * idx.shape[0], idx.shape[0])
        return {"val_loss": float(sums[0] / sums[1]) if sums[1] else None,
                "val_accuracy": None}

    # ------------------------------------------------------------------ records
    def _interval_record(self, interval: np.ndarray, seconds: float) -> Dict[str, Any]:
        samples = float(interval[1])
        return {"loss": float(interval[0] / max(samples, 1)),
                "lr": float(self.model.optimizer.param_groups[0]["lr"]),
                "grad_norm": self.model.grad_norm, "samples_per_second": samples / seconds,
                "comm_seconds": None,
                "tokens_per_second": samples * self.args.max_seq_length / seconds}

    def _record(self, logger: Any, bar: Progress, kind: str, values: Dict[str, Any],
                elapsed: float) -> None:
        write_record(logger, bar, kind, self.model.steps, values, elapsed)

    def _end_epoch(self, epoch_start: float, steps_before: int, logger: Any, bar: Progress,
                   start: float) -> None:
        seconds = time.perf_counter() - epoch_start
        record = epoch_record(self.epoch, self.epoch_sums, seconds,
                              self.model.steps - steps_before)
        if self.val is not None:
            record.update(self.evaluate())
        self.history.append(record)
        self._record(logger, bar, "epoch", record, time.perf_counter() - start)
        self.epoch, self.position, self.epoch_sums = self.epoch + 1, 0, np.zeros(2)

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        """Collective; once per step."""
        if self.saved_step == self.model.steps:
            return
        self.checkpoints.save(self.epoch, {
            "epoch": self.epoch, "position": self.position,
            "epoch_sums": [float(v) for v in self.epoch_sums], "elapsed": self.elapsed,
            "history": self.history.state_dict()})
        self.saved_step = self.model.steps

    def _resume(self, scheduler: Any) -> bool:
        state = self.checkpoints.resume()
        if state is None:
            return False
        steps = self.model.steps
        # the schedules are closed forms of the step count: replaying them restores the rate
        for _ in range(steps if scheduler is not None else 0):
            scheduler.step()
        per_epoch = len(self.batches)
        self.epoch = int(state.get("epoch", steps // per_epoch))
        self.position = int(state.get("position", steps % per_epoch))
        self.epoch_sums = np.array(state.get("epoch_sums", [0.0, 0.0]), dtype=np.float64)
        self.elapsed = float(state.get("elapsed", 0.0))
        if "history" in state:
            self.history.load_state_dict(state["history"])
        self.saved_step = steps
        return True


__all__ = ["PipelineLoop", "build_pipeline_model", "train_pipeline"]
