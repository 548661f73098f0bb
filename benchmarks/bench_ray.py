"""RayTrainer against our launcher: start-up time and the time of a training step.

The same job runs both ways: 2 workers train the digits MLP (64-128-10, 32 images per worker
per step, SGD with momentum), gradients all-reduced each step, one BLAS thread per worker.
Start-up is the wall time from the command (``fit()``, or the launcher's start) until every
worker has joined the process group and begins its first step; for Ray it is measured with Ray
still to start in this process ("cold": ``ray.init`` included) and once more with Ray running
("warm"). A step's time is the median over the timed steps of the slowest worker's step.
Prints the numbers and the ratios to the launcher's; writes no file.

    python benchmarks/bench_ray.py [--steps 200] [--warmup 10]
"""
from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on loopback addresses
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BATCH = 32  # per worker


def train(steps: int, warmup: int) -> dict:
    """The job, on every worker: (when the first step began, each timed step's slowest time)."""
    import neural_arch.distributed as dist
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.data import load_digits
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    features, labels = (np.asarray(a) for a in load_digits(seed=0)[0].arrays)
    manual_seed(0)
    model = MLP([64, 128, 10])
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    dist.barrier()
    began = time.time()
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        first = ((step * world + rank) * BATCH) % (len(labels) - BATCH)
        loss = F.cross_entropy(model(Tensor(features[first:first + BATCH])),
                               Tensor(labels[first:first + BATCH]))
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            grad = p.grad.array
            dist.all_reduce(grad)
            grad /= world
        optimizer.step()
        times.append(time.perf_counter() - start)
    slowest = np.array(times[warmup:])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    began_latest = np.array([began])
    dist.all_reduce(began_latest, op=dist.ReduceOp.MAX)
    backend = dist.get_backend()
    dist.destroy_process_group()
    return {"began": float(began_latest[0]), "step_s": float(np.median(slowest)),
            "rank": rank, "backend": backend}


def ray_loop(config: dict) -> None:
    from neural_arch.ray import report
    report(train(config["steps"], config["warmup"]))


def on_launcher(steps: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "result.json")
        env = dict(os.environ, NEURAL_ARCH_SECRET="bench-ray-secret-0123456789")
        start = time.time()
        subprocess.run([sys.executable, "-m", "neural_arch.distributed.launcher",
                        "--nproc-per-node", "2", os.path.abspath(__file__), "--", "--worker",
                        out, "--steps", str(steps), "--warmup", str(warmup)], env=env,
                       check=True, timeout=600)
        result = json.loads(open(out).read())
    return {"startup_s": result["began"] - start, "step_s": result["step_s"],
            "backend": result["backend"]}


def on_ray(steps: int, warmup: int) -> dict:
    import ray
    from neural_arch.ray import RayTrainer, RunConfig, ScalingConfig
    from neural_arch.ray.runtime import ensure_ray
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for label in ("cold", "warm"):
            start = time.time()
            if label == "cold":
                ensure_ray(num_cpus=2)
            trainer = RayTrainer(ray_loop, train_loop_config={"steps": steps, "warmup": warmup},
                                 scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(name=label, storage_path=folder))
            metrics = trainer.fit().metrics
            results[label] = {"startup_s": metrics["began"] - start, "step_s": metrics["step_s"],
                              "backend": metrics["backend"]}
    ray.shutdown()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps}, {args.warmup}")
    if args.worker:  # one rank under the launcher
        result = train(args.steps, args.warmup)
        if result["rank"] == 0:
            with open(args.worker, "w") as f:
                json.dump(result, f)
        return 0
    launcher = on_launcher(args.steps, args.warmup)
    ray_runs = on_ray(args.steps, args.warmup)
    print(f"digits MLP 64-128-10, 2 workers, {BATCH} images each per step, "
          f"{args.steps} timed steps")
    print(f"{'run':<22}{'backend':>8}{'start-up (s)':>14}{'step (ms)':>12}{'start-up x':>12}"
          f"{'step x':>9}")
    rows = [("launcher", launcher), ("RayTrainer, cold Ray", ray_runs["cold"]),
            ("RayTrainer, warm Ray", ray_runs["warm"])]
    for name, row in rows:
        print(f"{name:<22}{row['backend']:>8}{row['startup_s']:>14.2f}{row['step_s'] * 1e3:>12.3f}"
              f"{row['startup_s'] / launcher['startup_s']:>12.2f}"
              f"{row['step_s'] / launcher['step_s']:>9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
