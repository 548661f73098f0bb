"""The checkpoints in one directory: which exist, which are good, which to keep.

A checkpoint is good when every file matches its manifest (``format``). Checking
reads every file, so the answer is remembered while the manifest file stays the same.

Other processes may save into the same directory while this one reads it (a training job
while an evaluation job loads): a temporary directory is removed only when its writer is
gone, and a checkpoint that a writer removes or replaces while it is being read is read again
from a fresh listing, never reported as damaged.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

from . import format as fmt
from . import owner
from .format import (CheckpointChangedError, CheckpointCorruptError, CheckpointError,
                     NoCheckpointError)

# a child of the checkpoint package's logger: whoever listens there hears these warnings too
logger = logging.getLogger(__name__)

# A read starts over when a writer removed or replaced its checkpoint meanwhile; each new start
# follows a save that completed, so a few are plenty unless saves follow each other faster
# than one checkpoint can be read.
READ_ATTEMPTS = 8


class CheckpointDirectory:
    """Lists, verifies, chooses and rotates the checkpoints in ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._verified: Dict[str, Tuple[Tuple[int, int, int],
                                        Optional[CheckpointCorruptError]]] = {}

    def list(self) -> List[str]:
        """Paths of finished checkpoint directories, oldest first (not verified)."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        found = [(fmt.parse_checkpoint_name(n), n) for n in names]
        return [os.path.join(self.root, n) for key, n in sorted(f for f in found if f[0])
                if os.path.isdir(os.path.join(self.root, n))]

    def latest_good(self) -> Optional[str]:
        """The newest checkpoint whose files all match its manifest, or None; each damaged one
        passed over is reported with a warning naming the bad file."""
        for path in reversed(self.list()):
            problem = self.problem(path)
            if problem is None:
                return path
            warn_unusable(path, problem)
        return None

    def intact_newest_first(self) -> List[str]:
        """Every checkpoint whose files all match its manifest, newest first; each damaged one
        is reported with a warning naming the bad file."""
        intact = []
        for path in reversed(self.list()):
            problem = self.problem(path)
            if problem is None:
                intact.append(path)
            else:
                warn_unusable(path, problem)
        return intact

    def is_good(self, path: str) -> bool:
        """Full verification, remembered while the manifest file stays the same."""
        return self.problem(path) is None

    def problem(self, path: str) -> Optional[CheckpointError]:
        """None when every file of ``path`` matches its manifest; else ``CheckpointCorruptError``
        naming the bad file, or ``CheckpointChangedError`` when a writer removed or replaced it
        meanwhile. The verdict on a checkpoint is remembered while its manifest file stays the
        same (checking reads every file)."""
        try:
            info = os.stat(os.path.join(path, fmt.MANIFEST))
            stamp: Optional[Tuple[int, int, int]] = (info.st_mtime_ns, info.st_size, info.st_ino)
        except OSError:
            stamp = None  # no manifest to remember the verdict by: the read below says why
        cached = self._verified.get(path)
        if stamp is not None and cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            fmt.read_checkpoint_directory(path)
            problem: Optional[CheckpointCorruptError] = None
        except CheckpointChangedError as exc:
            return exc  # no longer there: nothing to remember
        except CheckpointCorruptError as exc:
            if not os.path.lexists(path):  # removed since it was listed
                return CheckpointChangedError(path)
            # a copy without the traceback, whose frames hold the arrays read so far
            problem = CheckpointCorruptError(exc.directory, exc.file, exc.reason)
        if stamp is not None:
            self._verified[path] = (stamp, problem)
        return problem

    def forget(self, path: str) -> None:
        """Drop what is remembered of ``path`` (it was just written or removed)."""
        self._verified.pop(path, None)

    def remove_temporaries(self) -> None:
        """Remove the temporary directories whose writer is gone (it crashed between writing
        and renaming, or while removing an old checkpoint). Those of a writer that still runs,
        in this process or another, are being filled or emptied: they stay."""
        for name in os.listdir(self.root):
            if not fmt.is_temporary_name(name):
                continue
            writer = fmt.temporary_writer(name)
            verdict = owner.GONE if writer is None else owner.state(writer)
            path = os.path.join(self.root, name)
            if verdict == owner.GONE:
                logger.warning("removing %s, left by an interrupted checkpoint write", path)
                shutil.rmtree(path, ignore_errors=True)
            elif verdict == owner.UNKNOWN:
                logger.info("leaving %s: its writer (pid %d) runs on another host or in "
                            "another container, where this process cannot check it",
                            path, writer.pid)

    def rotate(self, just_written: str, keep: int) -> None:
        """Keep the newest ``keep`` good ones; delete everything older than those."""
        paths = self.list()
        kept = 0
        for index in range(len(paths) - 1, -1, -1):
            if paths[index] == just_written or self.is_good(paths[index]):
                kept += 1
            if kept == keep:
                for old in paths[:index]:
                    if old != just_written:
                        fmt.remove_checkpoint_directory(old)
                        self.forget(old)
                return

    def choose(self, path: Any = None) -> Tuple[str, Dict[str, Any]]:
        """The checkpoint to load and its contents, every file verified.

        A ``path`` the caller named is loaded or refused: damage raises
        ``CheckpointCorruptError`` naming the file, because quietly restoring an older state
        than the one asked for would be a wrong result. Without a path, the newest good
        checkpoint is taken; a damaged one is skipped with a warning naming the bad file.
        """
        changed: Optional[CheckpointChangedError] = None
        for _ in range(READ_ATTEMPTS):
            try:
                if path is not None:
                    named = os.path.abspath(os.fspath(path))
                    return named, fmt.read_checkpoint_directory(named)
                return self._newest_good()
            except CheckpointChangedError as exc:
                changed = exc
        raise CheckpointError(f"checkpoints in {self.root} were removed or replaced while being "
                              f"read {READ_ATTEMPTS} times in a row (the last: "
                              f"{changed.directory}): they are saved faster than one can be read")

    def _newest_good(self) -> Tuple[str, Dict[str, Any]]:
        candidates = list(reversed(self.list()))
        if not candidates:
            raise NoCheckpointError(f"no checkpoint in {self.root}")
        problems = []
        for candidate in candidates:
            try:
                return candidate, fmt.read_checkpoint_directory(candidate)
            except CheckpointCorruptError as exc:
                if not os.path.lexists(candidate):  # removed since it was listed
                    raise CheckpointChangedError(candidate) from None
                warn_unusable(candidate, exc)
                problems.append(str(exc))
        raise CheckpointError(f"no usable checkpoint in {self.root}: " + "; ".join(problems))


def warn_unusable(path: str, problem: CheckpointError) -> None:
    """The line that tells which file of checkpoint ``path`` is bad and how (a checkpoint that
    a writer removed meanwhile is not damage: nothing is said)."""
    if isinstance(problem, CheckpointCorruptError):
        logger.warning("checkpoint %s is unusable: %s is bad (%s); falling back to the previous "
                       "checkpoint", path, problem.file or path, problem.reason)
