"""The Optuna study behind a tuner: its storage, pruner and sampler, and its resumption.

Storage: by default Optuna's ``JournalStorage`` over a journal file in the study's directory
(an append-only log many processes can share, no server); a path is taken as such a journal
file; a URL (``sqlite:///...``, ``mysql://...``) or an Optuna storage object goes to Optuna as
it is. A study reopened under the same storage and name resumes: its finished trials (done,
pruned or failed) count towards ``num_samples`` and are not run again. A trial the previous
tuner left running either had finished (its result is in its directory: it is recorded from
there) or was cut off: then it is marked failed and its config queued again once, as a new
trial whose ``retry_of`` names it. So no trial is lost and none is run twice to its end.
One tuner drives a study at a time: ``StudyLock`` refuses a second one while the first lives.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Set, Tuple

INSTALL_HINT = "pip install 'neural-arch[tune]'"
JOURNAL_FILE = "study.journal"
LOCK_FILE = "tuner.lock"
RETRY_OF = "retry_of"  # user attr of a trial that reruns an interrupted one
PRUNERS = ("asha", "median")
LOCK_TIMEOUT_S = 60.0  # a journal write waits this long at most for another writer


def require_optuna(owner: str) -> Any:
    try:
        import optuna
    except ImportError:
        raise RuntimeError(f"{owner}: hyperparameter search needs the optuna package, which "
                           f"is not installed; {INSTALL_HINT}") from None
    return optuna


def storage_for(storage: Any, study_dir: str) -> Any:
    """What ``optuna.create_study(storage=...)`` gets for the tuner's ``storage`` argument."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    if storage is None:
        storage = os.path.join(study_dir, JOURNAL_FILE)
    elif not isinstance(storage, (str, os.PathLike)) or "://" in str(storage):
        return storage  # a URL or a storage object: Optuna's business
    path = os.path.abspath(os.fspath(storage))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return JournalStorage(JournalFileBackend(path, lock_obj=KernelFileLock(path)))


class KernelFileLock:
    """The journal's write lock as ``flock`` on ``<journal>.flock``: the kernel releases it
    when its holder dies. Optuna's own locks are files that a tuner killed while writing
    leaves behind, and the next tuner would wait out their grace period (30 s) first."""

    def __init__(self, journal: str, timeout: float = LOCK_TIMEOUT_S) -> None:
        self.path, self.timeout = journal + ".flock", timeout
        self._descriptor: Optional[int] = None

    def acquire(self) -> bool:
        import fcntl
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._descriptor = descriptor
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(descriptor)
                    raise RuntimeError(f"DistributedTuner: the study journal's lock "
                                       f"{self.path} stayed held for {self.timeout:g} s by "
                                       f"another process") from None
                time.sleep(0.005)

    def release(self) -> None:
        import fcntl
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is not None:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            os.close(descriptor)


def pruner_for(scheduler: Any) -> Any:
    """"asha": successive halving from the first report on (Ray's ASHA with grace_period 1
    and reduction factor 4); "median": stop a trial worse than the median of the finished
    ones at the same step, once 3 have finished (Ray's median stopping rule); None: no
    pruning; an Optuna pruner is used as given."""
    import optuna
    if scheduler is None:
        return optuna.pruners.NopPruner()
    if isinstance(scheduler, optuna.pruners.BasePruner):
        return scheduler
    if scheduler == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=4)
    if scheduler == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=3)
    raise ValueError(f"DistributedTuner: scheduler must be one of {list(PRUNERS)}, None or "
                     f"an optuna pruner, got {scheduler!r}")


SEARCHES = ("tpe", "random")


def open_study(storage: Any, study_name: str, mode: str, seed: Optional[int],
               pruner: Any, search: str = "tpe") -> Any:
    """``search``: Optuna's TPE sampler, or "random" (Ray Tune's default search)."""
    import optuna
    direction = "minimize" if mode == "min" else "maximize"
    sampler = optuna.samplers.TPESampler if search == "tpe" else optuna.samplers.RandomSampler
    study = optuna.create_study(storage=storage, study_name=study_name, direction=direction,
                                sampler=sampler(seed=seed), pruner=pruner, load_if_exists=True)
    earlier = len(study.get_trials(deepcopy=False))
    if seed is not None and earlier:
        # a resumed study: the seeded sampler would draw the first tuner's configs again
        study.sampler = sampler(seed=seed + earlier)
    if study.direction.name.lower() != direction:
        raise ValueError(f"DistributedTuner: study {study_name!r} in this storage was made to "
                         f"{study.direction.name.lower()}; mode={mode!r} asks to {direction}; "
                         f"use another study_name")
    return study


def retried(trials: Iterable[Any]) -> Set[int]:
    """Numbers of the interrupted trials that a later trial reruns."""
    return {int(t.user_attrs[RETRY_OF]) for t in trials if RETRY_OF in t.user_attrs}


def finished_count(study: Any) -> int:
    """Trials that count towards ``num_samples``: done, pruned, or failed on their own."""
    from optuna.trial import TrialState
    trials = study.get_trials(deepcopy=False)
    rerun = retried(trials)
    return sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               or (t.state == TrialState.FAIL and t.number not in rerun))


def requeue(study: Any, number: int, params: Mapping[str, Any]) -> None:
    """Queue ``params`` again for the interrupted trial ``number``, then mark it failed. In
    that order, and not twice: a tuner stopped in between leaves it running, and the next
    one finds its retry already queued."""
    from optuna.trial import TrialState
    if number not in retried(study.get_trials(deepcopy=False)):
        study.enqueue_trial(dict(params), user_attrs={RETRY_OF: number})
    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)


def requeue_interrupted(study: Any, recover: Callable[[Any], bool]) -> Tuple[int, int]:
    """The running trials a stopped tuner left behind: those whose processes had finished
    (``recover`` records them from their files and says so) are kept, the others queued
    again; (kept, queued)."""
    from optuna.trial import TrialState
    left = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    kept = 0
    for trial in left:
        if recover(trial):
            kept += 1
        else:
            requeue(study, trial.number, trial.params)
    return kept, len(left) - kept


class StudyLock:
    """``tuner.lock`` in the study's directory, naming the tuner (host and pid) that drives
    the study; a second tuner of the same study is refused while that process lives."""

    def __init__(self, study_dir: str) -> None:
        self.path = os.path.join(study_dir, LOCK_FILE)
        self._held = False

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        me = f"{socket.gethostname()} {os.getpid()}"
        for _ in range(2):
            try:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None:
                    raise RuntimeError(f"DistributedTuner: the study in "
                                       f"{os.path.dirname(self.path)} is driven by another "
                                       f"tuner (host {holder[0]}, pid {holder[1]}); one tuner "
                                       f"at a time, or choose another study_name") from None
                os.unlink(self.path)  # its tuner is gone
                continue
            with os.fdopen(descriptor, "w") as handle:
                handle.write(me + "\n")
            self._held = True
            return
        raise RuntimeError(f"DistributedTuner: could not take {self.path}")

    def _holder(self) -> Optional[tuple]:
        """(host, pid) of a live holder; None when the holder is gone (or unreadable)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                host, pid = handle.read().split()
        except (OSError, ValueError):
            return None
        if host != socket.gethostname():
            return host, pid  # cannot tell from here: assume it lives
        return (host, pid) if _alive(pid) else None

    def release(self) -> None:
        if self._held:
            self._held = False
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _alive(pid: str) -> bool:
    """Whether ``pid`` runs; a zombie (killed, not yet reaped by its parent) does not."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, ValueError, IndexError):  # no procfs: ask the kernel
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, ValueError):
            pass
        return True


def config_of(params: Mapping[str, Any], constants: Mapping[str, Any]) -> Dict[str, Any]:
    return {**constants, **params}
