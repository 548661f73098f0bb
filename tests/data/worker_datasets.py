"""Datasets for the DataLoader worker tests, importable by name so that "spawn" workers, which
unpickle them in a fresh interpreter, find them too."""
from __future__ import annotations

import os
import random
import signal
import time

import numpy as np

from neural_arch.core.random import get_rng
from neural_arch.data import Dataset, get_worker_info

# What worker_init_fn saw in this process: a worker's list holds its own id, once.
INIT_CALLS: list = []


def record_init(worker_id: int) -> None:
    INIT_CALLS.append(worker_id)


def keep_items(items: list) -> list:
    """A collate_fn that returns the samples as they are."""
    return items


class Probe(Dataset):
    """Item ``i`` says who made it: worker id, pid, seed, init calls and three random draws.
    In a worker, index ``fail_at`` raises, ``kill_at`` SIGKILLs the worker, ``exit_at`` ends it
    with exit code 3, ``hang_at`` sleeps."""

    def __init__(self, n: int, fail_at: int = -1, kill_at: int = -1, hang_at: int = -1,
                 exit_at: int = -1) -> None:
        self.n, self.fail_at, self.kill_at, self.hang_at = n, fail_at, kill_at, hang_at
        self.exit_at = exit_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        info = get_worker_info()
        if info is not None:
            if index == self.fail_at:
                raise KeyError(f"index {index} is unreadable")
            if index == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if index == self.exit_at:
                os._exit(3)
            if index == self.hang_at:
                time.sleep(30)
        return {"index": index, "worker": None if info is None else info.id,
                "num_workers": None if info is None else info.num_workers,
                "pid": os.getpid(), "seed": None if info is None else info.seed,
                "dataset_is_probe": info is not None and isinstance(info.dataset, Probe),
                "inits": list(INIT_CALLS), "numpy": int(np.random.randint(2 ** 31)),
                "random": random.random(), "ours": float(get_rng().random())}


class Rows(Dataset):
    """Item ``i``: a float32 row of ``width`` values and the int label ``i % 7``, collated by
    ``default_collate`` (no ``_fetch_batch``); ``sleep`` seconds per item, or ``work`` NumPy."""

    def __init__(self, n: int, width: int = 3, sleep: float = 0.0, work: int = 0) -> None:
        self.n, self.width, self.sleep, self.work = n, width, sleep, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if self.sleep:
            time.sleep(self.sleep)
        row = np.arange(self.width, dtype=np.float32) + index
        if self.work:
            matrix = np.random.default_rng(index).standard_normal((self.work, self.work))
            row = row + np.float32(np.linalg.svd(matrix, compute_uv=False)[0] * 0)
        return row, index % 7
