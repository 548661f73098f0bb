"""The six programs of the porting table and how each one runs under torch and under ours.

Every program takes ``--save-init`` (write its first weights to a ``.npz``), ``--init-weights``
(start from such a file) and ``--losses-out`` (write the loss of every step as JSON; a
distributed program writes one file per rank, ``<path>.rank<R>``). A comparison runs torch's
variant first, which saves its first weights, then ours from those weights, each in its own
working directory, and returns both lists of losses.

The Horovod program needs Horovod for its torch run. Without it, the reference is a one-process
run of our own variant over the same data: a batch twice as large and the learning rate of two
ranks (the program scales it by ``hvd.size()``), whose loss at each step is the mean of the two
ranks' losses, as every rank's averaged gradient is the gradient of that mean.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from port_source import LineCounts, port

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"
REPO_ROOT = PROGRAMS_DIR.parents[2]
RUN_TIMEOUT_S = 240


@dataclass(frozen=True)
class Program:
    name: str  # the file's stem in programs/
    original: str  # repository, path and commit of the program it follows
    args: tuple = ()
    launcher: str = "python"  # "python", "torchrun" (DDP at 2 ranks) or "horovodrun"
    dense_args: tuple = ()  # Horovod without Horovod: our one-process reference's arguments

    @property
    def path(self) -> Path:
        return PROGRAMS_DIR / f"{self.name}.py"


PROGRAMS = (
    Program("mnist", "pytorch/examples mnist/main.py @ f15fac72e01158bcb704dded7c7e511f7a712a5f"),
    Program("word_language_model", "pytorch/examples word_language_model/main.py, model.py "
            "@ cd01f93000a6679e768700dd29e417a1e5fd10e5"),
    Program("ddp_torchrun", "pytorch/examples distributed/ddp-tutorial-series/"
            "multigpu_torchrun.py @ f62b4aec7bff832fc65b59aa62d60e94ddd6b39e",
            args=("2", "1"), launcher="torchrun"),
    Program("nanogpt", "karpathy/nanoGPT model.py, train.py "
            "@ e2221318e607eb5ee0669d6b7641af25a2111545"),
    Program("horovod_mnist", "horovod/horovod examples/pytorch/pytorch_mnist.py "
            "@ 034964ac5456b5484f156cc1a37655f349c13a37", launcher="horovodrun",
            dense_args=("--batch-size", "64", "--lr", "0.02")),
    Program("amp_recipe", "pytorch/tutorials recipes_source/recipes/amp_recipe.py "
            "@ db77dcf6e3637924f43852c014f2af9978b0f891"),
)


@dataclass
class Comparison:
    program: Program
    counts: LineCounts
    torch_losses: list  # per step; a distributed program's ranks, one list each
    our_losses: list
    reference: str  # "torch", or how the reference was made without torch's run
    notes: list = field(default_factory=list)


def _environment() -> dict:
    path = os.pathsep.join([str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def _command(launcher: str, framework: str, script: Path, ranks: int = 2) -> list:
    python = [sys.executable]
    if launcher == "python":
        return python + [str(script)]
    if launcher == "torchrun":
        module = ("torch.distributed.run" if framework == "torch"
                  else "neural_arch.distributed.launcher")
        extra = [] if framework == "torch" else ["--backend=shm"]
        return python + ["-m", module, "--standalone", f"--nproc_per_node={ranks}", *extra,
                         str(script)]
    if launcher == "horovodrun":
        runner = ["horovodrun"] if framework == "torch" else python + ["-m", "neural_arch.horovod.run"]
        return runner + ["-np", str(ranks), sys.executable, str(script)]
    raise ValueError(f"unknown launcher {launcher!r}")


# What torch's gloo threads print when they abort a process at interpreter teardown, after the
# program's work is done (seen once in a few hundred runs of the torchrun program)
TORCH_TEARDOWN_ABORT = "terminate called without an active exception"


def run_program(command: list, workdir: Path, args: list, label: str,
                torch_oracle: bool = False) -> None:
    """Run one variant; RuntimeError with its output if it fails. For torch's run only, an
    abort at teardown is let pass: the loss files read next show whether the program
    finished (a rank that aborted earlier wrote none, and reading them fails)."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(command + args, cwd=workdir, env=_environment(), text=True,
                            capture_output=True, timeout=RUN_TIMEOUT_S)
    if torch_oracle and TORCH_TEARDOWN_ABORT in result.stdout + result.stderr:
        return
    if result.returncode != 0:
        raise RuntimeError(f"{label} exited with {result.returncode}: {' '.join(command + args)}"
                           f"\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}")


def read_losses(path: Path, ranks: int) -> list:
    if ranks == 1:
        return json.loads(path.read_text())
    return [json.loads(Path(f"{path}.rank{rank}").read_text()) for rank in range(ranks)]


def write_variants(program: Program, workdir: Path) -> tuple[Path, Path, LineCounts]:
    """The torch program as written and our variant of it, side by side in ``workdir``."""
    source = program.path.read_text()
    ours, counts = port(source)
    (workdir / "torch").mkdir(parents=True, exist_ok=True)
    (workdir / "ours").mkdir(parents=True, exist_ok=True)
    torch_script = workdir / "torch" / program.path.name
    our_script = workdir / "ours" / program.path.name
    torch_script.write_text(source)
    our_script.write_text(ours)
    return torch_script, our_script, counts


def compare(program: Program, workdir: Path) -> Comparison:
    """Run ``program`` under torch and under ours from the same first weights."""
    torch_script, our_script, counts = write_variants(program, workdir)
    init = workdir / "init.npz"
    ranks = 1 if program.launcher == "python" else 2
    # horovodrun, not `import horovod`: the tests' own horovod/ folder is importable by that name
    horovod_missing = program.launcher == "horovodrun" and shutil.which("horovodrun") is None
    if horovod_missing:
        reference = ("reference: our one-process run with both ranks' batch and learning rate;"
                     " Horovod is not installed")
        # The seeded weights, negated: rank 1 builds the seeded ones, so only the broadcast
        # from rank 0 (which alone reads the file) can make the two ranks agree.
        seeded = workdir / "seeded.npz"
        run_program(_command("horovodrun", "ours", our_script, ranks=1), workdir / "seeded",
                    [*program.args, "--steps", "1", "--save-init", str(seeded)],
                    f"{program.name} (first weights)")
        np.savez(init, **{k: -v for k, v in np.load(seeded).items()})
        run_program(_command("horovodrun", "ours", our_script, ranks=1), workdir / "dense",
                    [*program.args, *program.dense_args, "--init-weights", str(init),
                     "--losses-out", str(workdir / "dense.json")], f"{program.name} (dense)")
        dense = read_losses(workdir / "dense.json.rank0", 1)
        torch_losses = [dense, dense]  # each step's reference is the mean of the ranks' losses
    else:
        reference = "torch"
        run_program(_command(program.launcher, "torch", torch_script), workdir / "run_torch",
                    [*program.args, "--save-init", str(init),
                     "--losses-out", str(workdir / "torch.json")], f"{program.name} (torch)",
                    torch_oracle=True)
        torch_losses = read_losses(workdir / "torch.json", ranks)
    run_program(_command(program.launcher, "ours", our_script), workdir / "run_ours",
                [*program.args, "--init-weights", str(init),
                 "--losses-out", str(workdir / "ours.json")], f"{program.name} (ours)")
    our_losses = read_losses(workdir / "ours.json", ranks)
    if horovod_missing:
        our_losses = [list(np.mean(our_losses, axis=0))] * 2
    return Comparison(program, counts, torch_losses, our_losses, reference)


def max_difference(comparison: Comparison) -> float:
    theirs = np.asarray(comparison.torch_losses, dtype=np.float64)
    ours = np.asarray(comparison.our_losses, dtype=np.float64)
    if theirs.shape != ours.shape:
        raise ValueError(f"{comparison.program.name}: torch's losses have shape {theirs.shape}, "
                         f"ours {ours.shape}")
    return float(np.max(np.abs(theirs - ours)))


def final_losses(comparison: Comparison) -> tuple[float, float]:
    """The last step's loss, torch's and ours (rank 0's for a distributed program)."""
    theirs, ours = comparison.torch_losses, comparison.our_losses
    if isinstance(theirs[0], list):
        theirs, ours = theirs[0], ours[0]
    return theirs[-1], ours[-1]
