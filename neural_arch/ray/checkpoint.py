"""``Checkpoint``: a directory of whatever the training loop saved, as in Ray Train.

A loop writes its state into a directory of its own and reports
``Checkpoint.from_directory(path)``; ``report`` copies that directory into the run's folder on
storage before it returns, so the loop may delete its copy. A restarted loop reads the copy
with ``get_checkpoint().as_directory()``.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


class Checkpoint:
    """A reference to a directory on storage that holds one checkpoint."""

    def __init__(self, path: PathLike) -> None:
        self.path = os.path.abspath(os.fspath(path))

    @classmethod
    def from_directory(cls, path: PathLike) -> "Checkpoint":
        """The checkpoint held by the local directory ``path`` (it must exist)."""
        if not os.path.isdir(path):
            raise ValueError(f"Checkpoint.from_directory: {os.fspath(path)!r} is not a directory")
        return cls(path)

    def _existing(self) -> str:
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"checkpoint directory {self.path!r} does not exist (deleted, "
                                    f"or on storage this machine does not share)")
        return self.path

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """The checkpoint as a local directory, to read from (not to change)."""
        yield self._existing()

    def to_directory(self, path: Optional[PathLike] = None) -> str:
        """Copy the checkpoint into ``path`` (default: a new temporary directory); its path."""
        source = self._existing()
        target = tempfile.mkdtemp(prefix="checkpoint_") if path is None else os.fspath(path)
        shutil.copytree(source, target, dirs_exist_ok=True)
        return target

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"
