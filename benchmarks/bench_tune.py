"""DistributedTuner: 16 trials of the digits MLP, 2 at a time with ASHA, against the same 16
trials one after another, and against Ray Tune's own run of the same search (backend="ray").

Each trial trains an MLP 64-hidden-10 on the digits data with SGD (momentum 0.9) for a few
epochs, searching ``lr`` (loguniform), ``hidden`` (choice) and ``batch_size`` (choice), and
reports the validation accuracy after each epoch (ASHA prunes on it, maximizing). The three
runs sample the same space with the same seeded TPE sampler; the first trials are the same
fixed configs (``points_to_evaluate``), the later ones follow what each run has seen. Wall
time is the tuner's ``tune()`` call (for Ray: with Ray already started, its start-up printed
apart). Prints a table and the command; writes no file.

    python benchmarks/bench_tune.py [--quick] [--trials 16] [--epochs 6] [--no-ray]
"""
from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on loopback addresses
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FIRST_POINTS = [{"lr": 0.05, "hidden": 64, "batch_size": 32},
                {"lr": 0.0005, "hidden": 16, "batch_size": 128}]


def train_digits(config: dict) -> dict:
    """One trial: the digits MLP, ``config["epochs"]`` epochs; reports the validation
    accuracy after each (step = the epoch, from 1) and returns the last."""
    import neural_arch.functional as F
    from neural_arch import tune
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.data import load_digits
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    (x, y), (vx, vy) = (tuple(np.asarray(a) for a in d.arrays) for d in load_digits(seed=0))
    manual_seed(0)
    model = MLP([64, config["hidden"], 10])
    optimizer = SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    rng = np.random.default_rng(0)
    batch, accuracy = config["batch_size"], 0.0
    for epoch in range(1, config["epochs"] + 1):
        order = rng.permutation(len(y))
        for first in range(0, len(y) - batch + 1, batch):
            rows = order[first:first + batch]
            loss = F.cross_entropy(model(Tensor(x[rows])), Tensor(y[rows]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        logits = model(Tensor(vx))
        logits = np.asarray(getattr(logits, "array", logits))
        accuracy = float((logits.argmax(axis=1) == vy).mean())
        tune.report(accuracy=accuracy, step=epoch)
    return {"accuracy": accuracy}


def search(trials: int, epochs: int, concurrent: int, backend: str, folder: str) -> dict:
    from neural_arch import tune
    tuner = tune.DistributedTuner(
        train_digits, {"lr": tune.loguniform(1e-4, 0.3), "hidden": tune.choice([16, 32, 64]),
                       "batch_size": tune.choice([32, 64, 128]), "epochs": epochs},
        num_samples=trials, metric="accuracy", mode="max", scheduler="asha",
        max_concurrent_trials=concurrent, backend=backend, seed=0,
        local_dir=os.path.join(folder, f"{backend}_{concurrent}"),
        points_to_evaluate=FIRST_POINTS, verbose=False)
    start = time.perf_counter()
    results = tuner.tune()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "best": results.best_result["accuracy"],
            "config": results.best_config, "complete": results.count("COMPLETE"),
            "pruned": results.count("PRUNED"), "failed": results.count("FAIL")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 trials of 3 epochs")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--no-ray", action="store_true", help="leave out Ray Tune's run")
    args = parser.parse_args()
    trials, epochs = (4, 3) if args.quick else (args.trials, args.epochs)
    command = "python benchmarks/bench_tune.py" + " ".join(
        [""] + [a for a in sys.argv[1:]])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as folder:
        rows.append(("Optuna, 2 at a time", search(trials, epochs, 2, "shm", folder)))
        rows.append(("Optuna, one after another", search(trials, epochs, 1, "shm", folder)))
        ray_start = None
        if not args.no_ray:
            try:
                import ray
                import ray.tune  # noqa: F401 - the extra's packages are there
            except ImportError as exc:
                print(f"Ray Tune left out: {exc}")
            else:
                started = time.perf_counter()
                ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                         object_store_memory=80 * 1024 * 1024, log_to_driver=False)
                ray_start = time.perf_counter() - started
                try:
                    rows.append(("Ray Tune, 2 at a time", search(trials, epochs, 2, "ray",
                                                                 folder)))
                finally:
                    ray.shutdown()
    base = rows[0][1]["seconds"]
    print(f"\n{trials} trials of the digits MLP ({epochs} epochs at most), ASHA on validation "
          f"accuracy, {os.cpu_count()} CPUs")
    print("| run | wall s | × 2-at-a-time | complete | pruned | failed | best accuracy | "
          "best config |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in rows:
        print(f"| {name} | {row['seconds']:.1f} | {row['seconds'] / base:.2f} | "
              f"{row['complete']} | {row['pruned']} | {row['failed']} | {row['best']:.4f} | "
              f"{row['config']} |")
    if ray_start is not None:
        print(f"\nRay start-up (ray.init, not in the wall time above): {ray_start:.1f} s")
    print(f"\nCommand: `{command}`")


if __name__ == "__main__":
    main()
