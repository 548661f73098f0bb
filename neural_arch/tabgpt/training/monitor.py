"""``DistributedTrainingMonitor``: measured step times, communication, throughput, resources and
scaling efficiency, as the TabGPT guide's ``get_training_statistics()`` reports them.

Nothing here is estimated from a formula. As a ``Trainer`` callback (``DistributedTrainer``
attaches one) it takes:
- step times from its own clock at the end of every optimizer step (the run's first step,
  which holds the set-up, left out, as the Trainer leaves it out of its rates);
- ``samples_per_second``, ``comm_seconds`` and ``comm_hidden_seconds`` from the Trainer's
  "train" records, the very values written to ``metrics.jsonl`` (samples of all ranks);
- every collective of the process, timed where it runs, with this rank's buffer bytes
  (``trace_collectives`` into a ``CommunicationProfiler``): ``communication_efficiency`` is
  their bytes over their seconds, MB/s;
- the payload bytes this rank's transport sent
  (``neural_arch.distributed.transports.sent_bytes``; 0 on
  shared memory, whose collectives read the peers' memory instead of sending messages);
- the process's CPU time and resident memory, sampled every ``monitoring_interval`` seconds.

Scaling efficiency is ``samples_per_second / (baseline * world_size)``, against the samples/s
of a one-process run: given (``baseline_samples_per_second=``, ``set_baseline``) or measured
(``DistributedTrainer.measure_baseline``); None until there is one. Used by hand, as in the
guide's loop, ``log_training_step`` and ``start/end_communication_profiling`` feed it instead.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import threading
import time
from typing import Any, Dict, List, Optional

from ..._files import write_whole
from ...distributed import get_rank, get_world_size, is_initialized
from ...distributed.profiler import set_collective_tracer
from ...distributed.transports.sent_bytes import counting_sent_bytes
from ...training.callbacks import Callback
from .profiler import CommunicationProfiler

__all__ = ["DistributedTrainingMonitor", "STATISTICS_FILE"]

STATISTICS_FILE = "training_statistics.json"
_JOIN_TIMEOUT_S = 5.0


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError, IndexError):  # not Linux: the peak is all there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class DistributedTrainingMonitor(Callback):
    def __init__(self, log_dir: Optional[str] = "./distributed_logs", rank: Optional[int] = None,
                 world_size: Optional[int] = None, monitoring_interval: float = 1.0,
                 baseline_samples_per_second: Optional[float] = None) -> None:
        if not (isinstance(monitoring_interval, (int, float)) and monitoring_interval > 0):
            raise ValueError(f"DistributedTrainingMonitor monitoring_interval must be a number "
                             f"of seconds > 0, got {monitoring_interval!r}")
        self.log_dir, self.monitoring_interval = log_dir, float(monitoring_interval)
        self._rank, self._world = rank, world_size
        self.baseline: Optional[float] = None
        self.write_every_rank = False  # DistributedConfig(log_communication_stats=True)
        if baseline_samples_per_second is not None:
            self.set_baseline(baseline_samples_per_second)
        self._reset()

    def _reset(self) -> None:
        self.profiler = CommunicationProfiler(rank=self.rank)
        self._step_times: List[float] = []
        self._samples = 0.0          # by hand: rows of every rank over the logged steps
        self._records: List[Dict[str, Any]] = []   # the Trainer's "train" records
        self._last_step: Optional[float] = None
        self._cpu: List[float] = []
        self._rss: List[float] = []
        self._sent = None
        self._stack: Optional[contextlib.ExitStack] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._loaded: Optional[Dict[str, Any]] = None

    @property
    def rank(self) -> int:
        if self._rank is not None:
            return int(self._rank)
        return get_rank() if is_initialized() else 0

    @property
    def world_size(self) -> int:
        if self._world is not None:
            return int(self._world)
        return get_world_size() if is_initialized() else 1

    def set_baseline(self, samples_per_second: float) -> None:
        """The samples/s of the same training in one process (scaling efficiency's base)."""
        if isinstance(samples_per_second, bool) or not isinstance(
                samples_per_second, (int, float)) or not samples_per_second > 0:
            raise ValueError(f"baseline samples_per_second must be a number > 0, got "
                             f"{samples_per_second!r}")
        self.baseline = float(samples_per_second)

    # ------------------------------------------------------------------ start and stop
    def start_monitoring(self) -> None:
        if self._stack is not None:
            raise RuntimeError("start_monitoring: the monitor is running already")
        stack = contextlib.ExitStack()
        previous = set_collective_tracer(self.profiler)
        stack.callback(set_collective_tracer, previous)
        if is_initialized():
            self._sent = stack.enter_context(counting_sent_bytes())
        self._stack, self._started = stack, time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="training-monitor",
                                        daemon=True)
        self._thread.start()

    def stop_monitoring(self) -> None:
        """Stops the sampling and the counting; safe to call more than once."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=_JOIN_TIMEOUT_S)
            self._thread = None
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def _sample(self) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        while not self._stop.wait(self.monitoring_interval):
            now, used = time.perf_counter(), time.process_time()
            self._cpu.append((used - cpu) / max(now - wall, 1e-9))
            self._rss.append(_rss_mb())
            wall, cpu = now, used
        now, used = time.perf_counter(), time.process_time()
        if now - wall > 1e-3:  # the last part interval too, so a short run has a sample
            self._cpu.append((used - cpu) / (now - wall))
            self._rss.append(_rss_mb())

    # ------------------------------------------------------------------ by hand
    def log_training_step(self, step: int, epoch: int, loss: float, learning_rate: float,
                          batch_size: int, step_time: float) -> None:
        """One step measured by the caller: ``batch_size`` rows on each of the ranks."""
        if not step_time > 0:
            raise ValueError(f"log_training_step(step={step}): step_time must be > 0 seconds, "
                             f"got {step_time!r}")
        self._step_times.append(float(step_time))
        self._samples += float(batch_size) * self.world_size

    def start_communication_profiling(self, operation: str, data_size_bytes: int = 0) -> int:
        return self.profiler.start_operation(operation, data_size_bytes)

    def end_communication_profiling(self, op_id: int) -> float:
        return self.profiler.end_operation(op_id)

    # ------------------------------------------------------------------ as a callback
    def on_fit_start(self, trainer: Any) -> None:
        self._reset()
        self._last_step = time.perf_counter()
        self._first = True
        self.start_monitoring()

    def on_step_end(self, trainer: Any, logs: Dict[str, Any]) -> None:
        now = time.perf_counter()
        if not self._first:
            self._step_times.append(now - self._last_step)
        self._first, self._last_step = False, now
        if logs.get("samples_per_second") is not None:
            self._records.append({key: logs.get(key) for key in (
                "step", "samples_per_second", "comm_seconds", "comm_hidden_seconds")})

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self.stop_monitoring()
        if self.log_dir is None:
            return
        if self.rank == 0:
            self.save_statistics(os.path.join(self.log_dir, STATISTICS_FILE))
        if self.write_every_rank:
            self.save_statistics(os.path.join(self.log_dir,
                                              f"training_statistics_rank{self.rank}.json"))

    # ------------------------------------------------------------------ the numbers
    def get_training_statistics(self) -> Dict[str, Any]:
        if self._loaded is not None:  # measured in worker processes (load_statistics)
            return self._with_efficiency(json.loads(json.dumps(self._loaded)))
        times = self._step_times
        if self._records:
            rate = statistics.fmean(r["samples_per_second"] for r in self._records)
        else:
            rate = self._samples / sum(times) if times else None
        ops = self.profiler.get_communication_stats()
        seconds = sum(v["total_time_ms"] for v in ops.values()) / 1e3
        traced = sum(v["total_bytes"] for v in ops.values())
        sent = None if self._sent is None else self._sent.counted
        overall = {
            "operations": sum(v["count"] for v in ops.values()), "total_bytes": traced,
            "total_time_ms": seconds * 1e3,
            "communication_efficiency": traced / 1e6 / seconds if seconds > 0 else 0.0,
            "sent_bytes": sent,
            "sent_mb_per_second": (sent / 1e6 / seconds) if sent is not None and seconds > 0
            else None,
            "comm_seconds": self._sum_records("comm_seconds"),
            "comm_hidden_seconds": self._sum_records("comm_hidden_seconds")}
        stats = {
            "rank": self.rank, "world_size": self.world_size, "steps": len(times),
            "step_timing": {
                "count": len(times), "total_time": sum(times),
                "avg_step_time": statistics.fmean(times) if times else None,
                "median_step_time": statistics.median(times) if times else None,
                "min_step_time": min(times) if times else None,
                "max_step_time": max(times) if times else None},
            "samples_per_second": rate, "train_records": len(self._records),
            "communication_stats": dict(ops, overall=overall),
            "resource_stats": {
                "samples": len(self._cpu),
                "avg_cpu_utilization": statistics.fmean(self._cpu) if self._cpu else None,
                "peak_rss_mb": max(self._rss) if self._rss else None}}
        return self._with_efficiency(stats)

    def _sum_records(self, key: str) -> Optional[float]:
        values = [r[key] for r in self._records if r.get(key) is not None]
        return float(sum(values)) if values else None

    def _with_efficiency(self, stats: Dict[str, Any]) -> Dict[str, Any]:
        rate, world = stats.get("samples_per_second"), stats["world_size"]
        stats["baseline_samples_per_second"] = self.baseline
        stats["scaling_efficiency"] = (rate / (self.baseline * world)
                                       if rate is not None and self.baseline else None)
        return stats

    def save_statistics(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        stats = self.get_training_statistics()
        write_whole(path, json.dumps(stats, indent=1), f"{path}.tmp{os.getpid()}")

    def load_statistics(self, path: str) -> Dict[str, Any]:
        """Take the statistics a monitor wrote (rank 0's, in worker processes) as this one's."""
        try:
            with open(path, encoding="utf-8") as handle:
                self._loaded = json.load(handle)
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"DistributedTrainingMonitor: cannot read the statistics the "
                               f"training wrote to {path}: {exc}") from exc
        self._world = self._loaded["world_size"]
        return self.get_training_statistics()

    def __getstate__(self) -> Dict[str, Any]:  # to worker processes: the settings only
        return {"log_dir": self.log_dir, "monitoring_interval": self.monitoring_interval,
                "_rank": self._rank, "_world": self._world, "baseline": self.baseline,
                "write_every_rank": self.write_every_rank}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
