"""``Trainer``: the training loop for any model and any parallelism, one process or many.

The step itself is the ``strategy``'s (``strategies``): "single", "ddp" (communication
overlapping backward), "zero1", "fsdp" (ZeRO-2/3), "tensor_parallel" and "pipeline" (a
``GPT3D``), each with its accumulation, clipping, precision and checkpoint format; without
one, ``TrainingConfig.zero_stage`` chooses. The Trainer adds what surrounds the step: the data
split over the strategy's data group, the learning-rate schedule, validation, metrics summed
over the ranks, logging and checkpoints on rank 0, early stopping and resume.

Without a process group the Trainer joins the job the environment describes (our launcher's,
torchrun's, mpirun's or srun's variables; ``joining``), a job of one when there is none, and
ends that group when ``fit`` returns, so one code path serves every world size. ``group``
selects the data-parallel ranks (the "dp" group of a device mesh when the model is also tensor
parallel; the "pipeline" strategy takes its model's); default: the whole world.
``resume_group`` (default: ``group``) holds every rank that must resume from the same step:
tensor-parallel ranks checkpoint their own shards into directories of their own, over their
data-parallel groups, so they pass the whole world, and a resume takes the newest step whose
checkpoint is intact in every directory (``DistributedCheckpointManager``); ``resumed_from``
then names the checkpoint that was loaded (None when the run did not resume).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..core import no_grad
from ..distributed import destroy_process_group, is_initialized
from .batches import batch_size_of, correct_predictions
from .callbacks import Callback, EarlyStopping, History
from .config import TrainingConfig
from .interval import TrainInterval
from .joining import join_job
from .metrics import MetricsLogger, epoch_record, write_record
from .mlflow_logger import require_mlflow, with_mlflow
from .progress import Progress
from .schedule import build_schedule
from .strategies import Strategy, resolve_strategy


class Trainer:
    def __init__(self, model: Any, optimizer: Any, loss_fn: Optional[Callable] = None,
                 config: Optional[TrainingConfig] = None,
                 callbacks: Sequence[Callback] = (), scheduler: Any = None,
                 group: Any = None, resume_group: Any = None, backend: str = "auto",
                 strategy: Any = None, num_processes: Optional[int] = None) -> None:
        self.config = config if config is not None else TrainingConfig()
        self._spawn = None
        self.resumed_from: Optional[str] = None  # the checkpoint fit() resumed from, if any
        if num_processes is not None and self._spawns(num_processes, group, resume_group):
            # Not yet a rank of a job: fit() starts the workers; each builds this Trainer.
            self.model, self.optimizer, self.history = model, optimizer, None
            self._spawn = (num_processes, "shm" if backend == "auto" else backend,
                           (model, optimizer, loss_fn, self.config, tuple(callbacks), scheduler),
                           {"backend": backend, "strategy": strategy})
            return
        self.strategy: Strategy = resolve_strategy(strategy, self.config)
        # backend: for the group the Trainer makes when there is none (else unused)
        self._owns_group = join_job(backend, announce=self.config.verbose)
        self.loss_fn, self.model = loss_fn, model
        self.strategy.setup(model, optimizer, self.config, group)
        self.group = self.strategy.data_group
        self.rank, self.world = self.strategy.data_rank, self.strategy.data_world
        self.is_logger = self.strategy.is_global_zero  # logs, prints and writes metrics
        self.optimizer, self.scheduler = self.strategy.optimizer, scheduler
        self.callbacks: List[Callback] = list(callbacks)
        if self.config.early_stopping_patience is not None:
            self.callbacks.append(EarlyStopping(self.config.monitor,
                                                self.config.early_stopping_patience))
        self.history = History(self.config.monitor)
        # epoch: the epochs finished (the sampler's epoch); what the run reports (lines,
        # metrics.jsonl, the History, callbacks' logs) numbers epochs from 1, as in "epoch 1/3"
        self.step = self.epoch = 0
        self.should_stop = False
        self._position = 0                    # batches of the current epoch already used
        self._epoch_sums = np.zeros(2)        # loss * samples, samples (this rank, this epoch)
        self._elapsed = 0.0                   # seconds of earlier runs (resume)
        self._saved_step = -1
        self._manager = None  # the strategy's checkpoints (save/load), if any
        if self.config.checkpoint_dir is not None:
            self._manager = self.strategy.checkpoints(self.config, resume_group)

    @staticmethod
    def _spawns(num_processes: Any, group: Any, resume_group: Any) -> bool:
        """Whether this Trainer starts ``num_processes`` workers of its own at ``fit``: more
        than one asked, and this process not already a rank of a job (then the job decides)."""
        from .launching import check_num_processes, under_launcher
        check_num_processes(num_processes, "num_processes", "Trainer")
        if num_processes == 1 or under_launcher():
            return False
        if group is not None or resume_group is not None:
            raise ValueError("Trainer(num_processes=...) starts a job of its own: group= and "
                             "resume_group= belong to a job that exists already")
        return True

    # ------------------------------------------------------------------ public
    def fit(self, train_loader: Any, val_loader: Any = None, epochs: Optional[int] = None,
            max_steps: Optional[int] = None, mlflow_experiment: Optional[str] = None) -> History:
        """``mlflow_experiment``: also record the run in MLflow (``MLflowLogger``)."""
        if mlflow_experiment is not None:
            require_mlflow("Trainer.fit")
        if self._spawn is not None:
            return self._fit_in_workers(train_loader, val_loader, epochs, max_steps,
                                        mlflow_experiment)
        if mlflow_experiment is not None:  # before the resume, which restores its run id
            self.callbacks = with_mlflow(self.callbacks, mlflow_experiment)
        cfg = self.config
        if not is_initialized():
            raise RuntimeError("Trainer.fit: no process group; this Trainer joined the job's "
                               "group itself and ended it after the last fit(): make a new "
                               "Trainer, or call init_process_group() before creating it")
        epochs = cfg.epochs if epochs is None else int(epochs)
        max_steps = cfg.max_steps if max_steps is None else int(max_steps)
        loader = self.strategy.shard_loader(train_loader, None, cfg.seed)
        val = None if val_loader is None else self.strategy.shard_loader(val_loader, False,
                                                                         cfg.seed)
        total = -(-epochs * len(loader) // cfg.gradient_accumulation_steps)
        total = total if max_steps is None else min(total, max_steps)
        if self.scheduler is None:
            self.scheduler = build_schedule(self.optimizer, cfg.lr_schedule, total,
                                            cfg.warmup_steps, cfg.min_lr_ratio)
        sampler = getattr(loader, "sampler", None)
        resumed = self._resume(sampler, len(loader)) if cfg.resume else False
        logger = None
        if self.is_logger and cfg.metrics_dir is not None:
            logger = MetricsLogger(cfg.metrics_dir, append=resumed)
        bar = Progress(total, self.step, enabled=self.is_logger and cfg.progress_bar,
                       verbose=self.is_logger and cfg.verbose)
        for callback in self.callbacks:
            callback.on_fit_start(self)
        start = time.perf_counter() - self._elapsed
        interval = TrainInterval(self.strategy)
        last_loss = float("nan")
        try:
            # a resumed run may already have done max_steps: then it only saves and reports
            while self.epoch < epochs and not self.should_stop and (
                    max_steps is None or self.step < max_steps):
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(self.epoch)
                epoch_start = time.perf_counter()
                steps_before = self.step
                self.strategy.train()
                for index, batch in enumerate(loader):
                    if index < self._position:  # resumed inside this epoch: skip what was used
                        continue
                    interval.begin_batch()
                    last_loss, n, stepped = self.strategy.training_step(batch, self.loss_fn)
                    self._epoch_sums += (last_loss * n, n)
                    interval.add(last_loss, n)
                    self._position = index + 1
                    if not stepped:
                        continue
                    self.step += 1
                    interval.stepped()
                    if self.scheduler is not None:
                        self.scheduler.step()
                    logs = {"step": self.step, "epoch": self.epoch + 1}
                    if self.step % cfg.log_interval == 0 or self.step == total:
                        logs.update(interval.flush(self.group, cfg.tokens_per_sample,
                                                   self._lr()))
                        self.history.samples += interval.flushed
                        self.history.last_loss = logs["loss"]
                        self._record(logger, bar, "train", logs, time.perf_counter() - start)
                    if cfg.eval_interval and val is not None and self.step % cfg.eval_interval == 0:
                        scores = self.evaluate(val)
                        self._record(logger, bar, "val", dict(scores, epoch=self.epoch + 1),
                                     time.perf_counter() - start)
                        self.strategy.train()
                    bar.advance(logs.get("loss"))
                    for callback in self.callbacks:
                        callback.on_step_end(self, logs)
                    if cfg.save_interval and self.step % cfg.save_interval == 0:
                        self._elapsed = time.perf_counter() - start
                        self.save_checkpoint(last_loss, sampler)
                    if (max_steps is not None and self.step >= max_steps) or self.should_stop:
                        break
                else:  # the epoch ran to its end
                    self._end_epoch(val, epoch_start, steps_before, logger, bar, start)
                    if self._manager is not None and not cfg.save_interval and (
                            self.epoch % cfg.save_every_epochs == 0):
                        self._elapsed = time.perf_counter() - start
                        self.save_checkpoint(last_loss, sampler)
                    continue
                break  # max_steps reached (or a callback stopped) inside the epoch
            self._elapsed = time.perf_counter() - start
            self.history.total_time, self.history.steps = self._elapsed, self.step
            self.history.stopped_early = self.should_stop
            if self._manager is not None:
                self.save_checkpoint(last_loss, sampler)
            for callback in self.callbacks:
                callback.on_fit_end(self, self.history)
            bar.summary(self.history, self.world, cfg.tokens_per_sample)
        finally:
            bar.close()
            if logger is not None:
                logger.close()
            if self._owns_group and is_initialized():
                destroy_process_group()
                self._owns_group = False
        return self.history

    def _fit_in_workers(self, train_loader: Any, val_loader: Any, epochs: Optional[int],
                        max_steps: Optional[int], mlflow_experiment: Optional[str]) -> History:
        """``fit`` in ``num_processes`` workers started here (``launching``): rank 0's History,
        and its trained weights loaded into this model when every rank holds all of it."""
        from .launching import pickle_recipe, run_in_processes, stop_main_import
        from .launching.trainer_recipe import TrainerRecipe
        num_processes, backend, args, kwargs = self._spawn
        fit_kwargs = {k: v for k, v in (("epochs", epochs), ("max_steps", max_steps),
                                        ("mlflow_experiment", mlflow_experiment))
                      if v is not None}
        recipe = TrainerRecipe(args, kwargs, train_loader, val_loader, fit_kwargs)
        stop_main_import("Trainer.fit")
        payload = pickle_recipe(recipe, recipe.parts(), "Trainer")
        self.history, weights = run_in_processes(payload, num_processes, backend=backend,
                                                 owner="Trainer.fit")
        if weights is not None:
            self.model.load_state_dict(weights)
        return self.history

    def evaluate(self, loader: Any) -> Dict[str, Optional[float]]:
        """Loss and accuracy over ``loader`` (this rank's share), averaged over the ranks."""
        sums = np.zeros(4)  # loss * samples, samples, correct, counted
        # a strategy or model that decides its predictions itself (a tensor-parallel GPT, a
        # pipeline's last stage: the argmax over the vocabulary split across the tp group)
        predict = getattr(self.strategy, "predicted_tokens", None) or getattr(
            self.model, "predicted_tokens", None)
        self.strategy.eval()
        with no_grad():
            for index, batch in enumerate(loader):
                if self.config.eval_batches is not None and index >= self.config.eval_batches:
                    break
                output, loss, target = self.strategy.evaluation_step(batch, self.loss_fn)
                n = batch_size_of(batch)
                correct, counted = (correct_predictions(output, target, predict)
                                    if self.config.compute_accuracy else (0.0, 0.0))
                sums += (loss * n, n, correct, counted)
        self.strategy.reduce(sums)
        return {"val_loss": float(sums[0] / sums[1]) if sums[1] else None,
                "val_accuracy": float(sums[2] / sums[3]) if sums[3] else None}

    def save_checkpoint(self, loss: float, sampler: Any = None) -> Optional[str]:
        """Collective (over the data-parallel group, or as the strategy's checkpoints are)."""
        if self._manager is None or self._saved_step == self.step:
            return None
        extra = {"step": self.step, "epoch": self.epoch, "position": self._position,
                 "epoch_sums": [float(v) for v in self._epoch_sums],
                 "elapsed": self._elapsed, "history": self.history.state_dict(),
                 "callbacks": [c.state_dict() if hasattr(c, "state_dict") else None
                               for c in self.callbacks]}
        path = self._manager.save(self.epoch, self.step, loss if np.isfinite(loss) else None,
                                  extra, scheduler=self.scheduler, sampler=sampler)
        self._saved_step = self.step
        return path

    # ------------------------------------------------------------------ internals
    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def _resume(self, sampler: Any, batches_per_epoch: int) -> bool:
        if self._manager is None:
            raise ValueError("TrainingConfig(resume=True) needs a checkpoint_dir to resume from")
        extra = self._manager.load(scheduler=self.scheduler, sampler=sampler)
        if extra is None:
            return False
        self.resumed_from = getattr(self._manager, "loaded_path", None)
        self.step = int(extra["step"])
        if "epoch" in extra:
            self.epoch, self._position = int(extra["epoch"]), int(extra["position"])
        else:  # a checkpoint without the loop's state: where the step count puts it
            used = self.step * self.config.gradient_accumulation_steps
            self.epoch, self._position = divmod(used, max(batches_per_epoch, 1))
        self._epoch_sums = np.array(extra.get("epoch_sums", (0.0, 0.0)), dtype=np.float64)
        self._elapsed = float(extra.get("elapsed", 0.0))
        if "history" in extra:
            self.history.load_state_dict(extra["history"])
        for callback, state in zip(self.callbacks, extra.get("callbacks", ())):
            if state is not None and hasattr(callback, "load_state_dict"):
                callback.load_state_dict(state)
        self._saved_step = self.step
        return True

    def _end_epoch(self, val: Any, epoch_start: float, steps_before: int, logger: Any,
                   bar: "Progress", start: float) -> None:
        sums = self.strategy.reduce(self._epoch_sums.copy())
        seconds = time.perf_counter() - epoch_start
        record = epoch_record(self.epoch, sums, seconds, self.step - steps_before)
        if val is not None:
            record.update(self.evaluate(val))
        self.history.append(record)
        self._record(logger, bar, "epoch", record, time.perf_counter() - start)
        for callback in self.callbacks:
            callback.on_epoch_end(self, record)
        self.epoch += 1
        self._position = 0
        self._epoch_sums = np.zeros(2)

    def _record(self, logger: Any, bar: "Progress", kind: str, values: Dict[str, Any],
                elapsed: float) -> None:
        write_record(logger, bar, kind, self.step, values, elapsed)
