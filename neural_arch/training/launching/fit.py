"""``fit_in_processes``: a Trainer's ``fit`` in N processes of this host, started by the call.

Not yet a rank of a job (no process group, no launcher's, mpirun's or srun's variables), the
call starts ``num_processes`` workers through the launcher (``processes``); each builds its
Trainer from the recipe, which joins the job the launcher describes, and fits; rank 0's
``History`` comes back. Already a rank of a job, it builds the Trainer and fits right here, so
one script runs alike under ``python script.py``, the launcher, torchrun, mpirun and srun.
A script may call it at its top level without ``if __name__ == "__main__":``: each worker runs
the script only up to that call (``main_import``).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

from ...distributed import is_initialized
from ...distributed.rendezvous.families import is_job_step, present
from .processes import run_in_processes
from .main_import import importing_main, stop_main_import
from .recipe_check import pickle_recipe

OWNER = "fit_in_processes"


def under_launcher(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when this process is already a rank of a job: a process group exists, or a
    launcher's variables (ours, torchrun's, Horovod's, MPI's, srun's, ...) were set for it. A
    SLURM batch script's inherited SLURM_PROCID is not an srun task (``is_job_step``).
    While a worker imports the main script it is not one yet: the script's top level takes
    the parent's path (a Trainer keeps its arguments) up to its training call, which ends the
    import (``main_import``) rather than joining the job there."""
    if importing_main():
        return False
    if is_initialized():
        return True
    environ = os.environ if environ is None else environ
    return any(is_job_step(family, environ) for family in present(environ))


def check_num_processes(value: Any, name: str, owner: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return value


class FitRecipe:
    """What each worker runs: ``make_trainer()``, then its ``fit`` with the loaders."""

    def __init__(self, make_trainer: Callable[[], Any], train_loader: Any, val_loader: Any,
                 fit_kwargs: Mapping[str, Any]) -> None:
        self.make_trainer, self.train_loader, self.val_loader = (make_trainer, train_loader,
                                                                 val_loader)
        self.fit_kwargs = dict(fit_kwargs)

    def __call__(self) -> Any:
        trainer = self.make_trainer()
        if not callable(getattr(trainer, "fit", None)):
            raise TypeError(f"{OWNER}: make_trainer() must return a Trainer, got "
                            f"{type(trainer).__name__}")
        return trainer.fit(self.train_loader, self.val_loader, **self.fit_kwargs)


def fit_in_processes(make_trainer: Callable[[], Any], train_loader: Any, val_loader: Any = None,
                     *, num_processes: int, backend: str = "shm",
                     timeout: Optional[float] = None, **fit_kwargs: Any) -> Any:
    """Rank 0's ``History`` of ``make_trainer().fit(train_loader, val_loader, **fit_kwargs)``
    run in ``num_processes`` processes.

    ``make_trainer`` builds the model, optimizer and Trainer in each worker: a function or
    class defined at the top level of an importable module (or a ``functools.partial`` of
    one), as everything here is pickled for the workers (checked before any starts).
    ``backend`` is the workers' transport; ``timeout`` (seconds, None: none) caps the whole
    run, while every collective has its own. A plain ``DataLoader``'s ``batch_size`` is per
    process: the Trainer shards its order over the ranks. With ``num_processes=1``, or when
    this process is already a rank of a job, the fit runs here. RuntimeError names a worker
    that failed (its rank, exit code or signal, and what it raised); the others are stopped.
    """
    stop_main_import(OWNER)
    if not callable(make_trainer) or callable(getattr(make_trainer, "fit", None)):
        raise TypeError(f"{OWNER}: make_trainer must be a callable that builds the Trainer in "
                        f"each worker (a Trainer made here has joined this process's group), "
                        f"got {type(make_trainer).__name__}")
    num_processes = check_num_processes(num_processes, "num_processes", OWNER)
    recipe = FitRecipe(make_trainer, train_loader, val_loader, fit_kwargs)
    if num_processes == 1 or under_launcher():
        return recipe()
    parts = {"make_trainer": make_trainer, "train_loader": train_loader,
             "val_loader": val_loader, **fit_kwargs}
    payload = pickle_recipe(recipe, parts, OWNER)
    return run_in_processes(payload, num_processes, backend=backend, timeout=timeout,
                            owner=OWNER)
