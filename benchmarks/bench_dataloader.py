"""DataLoader throughput against torch's: samples per second of a whole epoch over a dataset
whose ``__getitem__`` does about a millisecond of NumPy work, with 0 and 2 worker processes.

Each sample: an image (3×32×32, float32) drawn from a generator seeded by its index, scaled
by the singular values of ``--svds`` 48×48 matrices (the work a decoding or augmenting
dataset does per sample). Both loaders read the same dataset with the same batch size, no
shuffling, their default collation and fresh workers every epoch (so the time includes
starting them, as a training epoch does). One BLAS thread per process, so that the workers
are what runs in parallel. Epochs of every (loader, workers) are interleaved in rotating
order; each reports the median epoch. The first batches of both loaders are checked equal.

    python benchmarks/bench_dataloader.py [--quick] [--samples 512] [--batch 32] [--svds 4]
        [--workers 0,2] [--epochs 3] [--no-torch] [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional, Sequence  # noqa: E402

import numpy as np  # noqa: E402

SECTION = "bench_dataloader"
NO_TORCH = "torch not installed: peer rows skipped"
MATRIX = 48


class SvdImages:
    """``samples`` images; each ``__getitem__`` runs ``svds`` SVDs of 48×48 matrices."""

    def __init__(self, samples: int, svds: int) -> None:
        self.samples, self.svds = samples, svds

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < self.samples:
            raise IndexError(f"SvdImages index {index} out of range for {self.samples} samples")
        rng = np.random.default_rng(index)
        image = rng.standard_normal((3, 32, 32)).astype(np.float32)
        scale = 0.0
        for _ in range(self.svds):
            scale += float(np.linalg.svd(rng.standard_normal((MATRIX, MATRIX)),
                                         compute_uv=False)[0])
        return image * np.float32(1.0 / scale)


def sample_ms(dataset: SvdImages, count: int = 50) -> float:
    start = time.perf_counter()
    for i in range(count):
        dataset[i % len(dataset)]
    return (time.perf_counter() - start) / count * 1e3


def loaders(torch, dataset: SvdImages, batch: int, workers: Sequence[int]) -> Dict[tuple, Any]:
    from neural_arch.data import DataLoader
    made = {("neural_arch", w): DataLoader(dataset, batch_size=batch, num_workers=w)
            for w in workers}
    if torch is not None:
        made.update({("torch", w): torch.utils.data.DataLoader(dataset, batch_size=batch,
                                                               num_workers=w)
                     for w in workers})
    return made


def _as_numpy(batch: Any) -> np.ndarray:
    return batch.numpy() if hasattr(batch, "numpy") else np.asarray(batch)


def check_same_batches(made: Dict[tuple, Any]) -> None:
    """Every loader's first batch must be the same array (same data, same order)."""
    reference, first = None, None
    for key, loader in made.items():
        batch = _as_numpy(next(iter(loader)))
        if reference is None:
            reference, first = batch, key
        elif batch.shape != reference.shape or not np.array_equal(batch, reference):
            raise RuntimeError(f"first batch of {key} (shape {batch.shape}) differs from that "
                               f"of {first} (shape {reference.shape})")


def epoch_seconds(loader: Any, expected_batches: int) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in loader)
    seconds = time.perf_counter() - start
    if count != expected_batches:
        raise RuntimeError(f"an epoch gave {count} batches, expected {expected_batches}")
    return seconds


def measure(made: Dict[tuple, Any], epochs: int, expected_batches: int) -> Dict[tuple, float]:
    """{(loader, workers): median epoch seconds}, epochs interleaved in rotating order."""
    keys = list(made)
    times: Dict[tuple, List[float]] = {key: [] for key in keys}
    for epoch in range(epochs):
        shift = epoch % len(keys)
        for key in keys[shift:] + keys[:shift]:
            times[key].append(epoch_seconds(made[key], expected_batches))
    return {key: float(np.median(v)) for key, v in times.items()}


def report(rates: Dict[tuple, float], workers: Sequence[int], command: str, machine: str,
           args: argparse.Namespace, per_sample: float, torch) -> str:
    peer = f"torch {torch.__version__}" if torch is not None else NO_TORCH
    lines = common.section_head(
        "DataLoader throughput against PyTorch (`benchmarks/bench_dataloader.py`)", command,
        f"{machine}; {peer}",
        f"{args.samples} samples per epoch, batch {args.batch}, no shuffling; each sample a "
        f"3×32×32 float32 image after {args.svds} SVD(s) of a {MATRIX}×{MATRIX} matrix "
        f"({per_sample:.2f} ms per `__getitem__` here, in the main process); one BLAS thread "
        f"per process; fresh workers every epoch (start-up included); median of "
        f"{args.epochs} interleaved epochs. The machine has {os.cpu_count()} cores and was "
        f"shared with other work while this ran: treat single numbers with care.")
    if torch is None:
        lines += [NO_TORCH + ".", ""]
    body = []
    for w in workers:
        ours = rates[("neural_arch", w)]
        row = [w, f"{ours:.0f}", f"{ours / rates[('neural_arch', workers[0])]:.2f}"]
        if torch is not None:
            theirs = rates[("torch", w)]
            row += [f"{theirs:.0f}", f"{theirs / rates[('torch', workers[0])]:.2f}",
                    f"{ours / theirs:.2f}"]
        else:
            row += ["—", "—", "—"]
        body.append(row)
    lines.append(common.markdown_table(
        ["num_workers", "neural_arch samples/s", f"× workers {workers[0]}", "torch samples/s",
         f"× workers {workers[0]}", "neural_arch / torch"], body))
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 samples, 1 SVD, 1 epoch")
    parser.add_argument("--samples", type=int, help="samples per epoch (default 512; quick 64)")
    parser.add_argument("--batch", type=int, help="default 32 (quick 16)")
    parser.add_argument("--svds", type=int, help="SVDs per sample (default 4; quick 1)")
    parser.add_argument("--workers", default="0,2", help="worker counts, comma separated")
    parser.add_argument("--epochs", type=int, help="timed epochs per loader (default 3; "
                        "quick 1)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if installed")
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    args.samples = args.samples or (64 if args.quick else 512)
    args.batch = args.batch or (16 if args.quick else 32)
    args.svds = args.svds or (1 if args.quick else 4)
    args.epochs = args.epochs or (1 if args.quick else 3)
    try:
        args.workers = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        parser.error(f"cannot read --workers {args.workers!r}")
    if not args.workers or min(args.workers + [args.samples, args.batch, args.svds,
                                               args.epochs]) < 0 or \
            min(args.samples, args.batch, args.svds, args.epochs) < 1:
        parser.error(f"--workers: counts >= 0; --samples, --batch, --svds, --epochs >= 1; "
                     f"got {vars(args)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    machine = common.machine_info()
    command = common.command_line("benchmarks/bench_dataloader.py",
                                  sys.argv[1:] if argv is None else argv)
    torch = None
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            torch = None
    if torch is None:
        print(NO_TORCH if not args.no_torch else "--no-torch: peer rows skipped", flush=True)
    dataset = SvdImages(args.samples, args.svds)
    per_sample = sample_ms(dataset)
    made = loaders(torch, dataset, args.batch, args.workers)
    check_same_batches(made)
    expected = -(-args.samples // args.batch)
    seconds = measure(made, args.epochs, expected)
    rates = {key: args.samples / s for key, s in seconds.items()}
    common.publish(report(rates, args.workers, command, machine, args, per_sample, torch),
                   args.output, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
