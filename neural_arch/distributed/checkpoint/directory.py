"""The checkpoints in one directory: which exist, which are good, which to keep.

A checkpoint is good when every file matches its manifest (``format``). Checking
reads every file, so the answer is remembered while the manifest file stays the same.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

from . import format as fmt
from .format import CheckpointCorruptError, CheckpointError, NoCheckpointError

# a child of the checkpoint package's logger: whoever listens there hears these warnings too
logger = logging.getLogger(__name__)


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
        except CheckpointCorruptError:
            good = False
        self._verified[path] = (stamp, good)
        return good

    def forget(self, path: str) -> None:
        """Drop what is remembered of ``path`` (it was just written or removed)."""
        self._verified.pop(path, None)

    def remove_temporaries(self) -> None:
        """Directories left by a crash between writing and renaming are never valid."""
        for name in os.listdir(self.root):
            if fmt.is_temporary_name(name):
                logger.warning("removing %s, left by an interrupted checkpoint write",
                               os.path.join(self.root, name))
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

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
                        shutil.rmtree(old, ignore_errors=True)
                        self.forget(old)
                return

    def choose(self, path: Any = None) -> Tuple[str, Dict[str, Any]]:
        """The first good checkpoint and its contents, every file verified: ``path`` if given
        (then the older ones in this directory), else the newest first."""
        candidates = list(reversed(self.list()))
        if path is not None:
            path = os.path.abspath(os.fspath(path))
            key = fmt.parse_checkpoint_name(os.path.basename(path))
            if os.path.dirname(path) == self.root and key is not None:
                older = [c for c in candidates
                         if fmt.parse_checkpoint_name(os.path.basename(c)) < key]
                candidates = [path] + older
            else:
                candidates = [path]
        elif not candidates:
            raise NoCheckpointError(f"no checkpoint in {self.root}")
        problems = []
        for candidate in candidates:
            try:
                if not os.path.isdir(candidate):
                    raise CheckpointCorruptError(candidate, "", "no such checkpoint directory")
                return candidate, fmt.read_checkpoint_directory(candidate)
            except CheckpointCorruptError as exc:
                logger.warning("checkpoint %s is unusable: %s is bad (%s); falling back to the "
                               "previous checkpoint", candidate, exc.file or candidate,
                               exc.reason)
                problems.append(str(exc))
        raise CheckpointError(f"no usable checkpoint in {self.root}: " + "; ".join(problems))
