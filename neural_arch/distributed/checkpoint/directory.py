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
        self._verified: Dict[str, Tuple[Tuple[int, int, int], bool]] = {}

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
        """The newest checkpoint whose files all match its manifest, or None."""
        for path in reversed(self.list()):
            if self.is_good(path):
                return path
        return None

    def is_good(self, path: str) -> bool:
        """Full verification, remembered while the manifest file stays the same."""
        try:
            info = os.stat(os.path.join(path, fmt.MANIFEST))
            stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        except OSError:
            return False
        cached = self._verified.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            fmt.read_checkpoint_directory(path)
            good = True
        except CheckpointChangedError:
            return False  # no longer there: nothing to remember
        except CheckpointCorruptError:
            good = False
        self._verified[path] = (stamp, good)
        return good

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
                logger.warning("checkpoint %s is unusable: %s is bad (%s); falling back to the "
                               "previous checkpoint", candidate, exc.file or candidate,
                               exc.reason)
                problems.append(str(exc))
        raise CheckpointError(f"no usable checkpoint in {self.root}: " + "; ".join(problems))
