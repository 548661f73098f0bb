"""On-disk format of checkpoints: JSON and safetensors only, a manifest of checksums and atomic
directory writes and removals.

A checkpoint is a directory ``ckpt-e<epoch>-s<step>`` whose ``manifest.json`` (written last)
lists every other file with its SHA-256 and size. It is built in
``<name>.tmp-<writer>-<random>``: each file is fsynced, then the directory, then it is renamed
into place and the parent is fsynced, so a crash leaves either the previous state or a complete
checkpoint, plus at most a temporary directory. ``<writer>`` names the process writing it
(``owner``), so that a scan removes only the temporaries of writers that are gone. A checkpoint
is removed (rotation, the same step saved again) by renaming it to ``<name>.old-<writer>-<random>``
first, so no reader ever finds a half-deleted checkpoint under a real name.

A checkpoint is read through one open handle of its directory: a reader whose checkpoint is
removed or replaced meanwhile gets ``CheckpointChangedError``, not a mix of two checkpoints and
not a report of damage.

Values are written as JSON (``values``) and arrays as safetensors. Nothing is ever pickled.
The names of checkpoints, of their temporaries and of the files inside are in ``names``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any, Dict, Optional

from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

# Re-exported: the checkpoint code reaches every name as ``format.<name>``.
from .names import (MANIFEST, META, MODEL_FILE, OPTIMIZER_FILE, checkpoint_name,
                    is_per_rank_file, is_temporary_name, parse_checkpoint_name, rank_file,
                    shard_files, temporary_name, temporary_writer)
from .values import host_array


FORMAT = "neural_arch.checkpoint"
VERSION = 1


class CheckpointError(RuntimeError):
    """No usable checkpoint could be loaded."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is missing, truncated, altered or unreadable; ``file`` names it."""

    def __init__(self, directory: str, file: str, reason: str) -> None:
        super().__init__(f"{os.path.join(directory, file)}: {reason}")
        self.directory, self.file, self.reason = directory, file, reason


class CheckpointChangedError(CheckpointError):
    """The checkpoint was removed or replaced by a writer while it was being read."""

    def __init__(self, directory: str) -> None:
        super().__init__(f"{directory}: removed or replaced by a writer while being read")
        self.directory = directory


class NoCheckpointError(FileNotFoundError):
    """The checkpoint directory holds no checkpoint at all."""


# ----- bytes ---------------------------------------------------------------------------------------
def safetensors_bytes(arrays: Dict[str, Any]) -> bytes:
    return save_safetensors({k: host_array(v) for k, v in arrays.items()})


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, allow_nan=False, sort_keys=True, indent=1).encode("utf-8")


# ----- files -------------------------------------------------------------------------------------
def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint_directory(parent: str, name: str, files: Dict[str, bytes]) -> str:
    """Write ``files`` and their manifest atomically as ``parent/name``; returns its path."""
    temporary = begin_checkpoint_directory(parent, name)
    try:
        listing = {file_name: write_checkpoint_file(temporary, file_name, data)
                   for file_name, data in files.items()}
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return finish_checkpoint_directory(parent, name, temporary, listing)


# A checkpoint written by several processes (each rank its own shard files) goes through the
# same three steps: one writer begins the temporary directory, every writer adds its files and
# reports their listing entries, the first writer finishes (manifest, then the rename).
def begin_checkpoint_directory(parent: str, name: str) -> str:
    """Create the temporary directory a checkpoint ``name`` is written into; its path."""
    temporary = os.path.join(parent, temporary_name(name, "tmp"))
    os.mkdir(temporary)
    return temporary


def remove_temporary_directory(temporary: str) -> None:
    """Drop a checkpoint that will not be finished."""
    shutil.rmtree(temporary, ignore_errors=True)


def write_checkpoint_file(temporary: str, file_name: str, data: bytes) -> Dict[str, Any]:
    """Write one file of a checkpoint being built; returns its manifest entry."""
    _write_synced(os.path.join(temporary, file_name), data)
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def finish_checkpoint_directory(parent: str, name: str, temporary: str,
                                listing: Dict[str, Dict[str, Any]]) -> str:
    """Write the manifest of ``listing`` and move the checkpoint into place as ``parent/name``
    (replacing one of the same name); the temporary is removed on failure."""
    final = os.path.join(parent, name)
    try:
        manifest = {"format": FORMAT, "version": VERSION, "files": listing}
        _write_synced(os.path.join(temporary, MANIFEST), json_bytes(manifest))
        fsync_directory(temporary)
        replaced = None
        if os.path.lexists(final):  # the same epoch and step saved again: the new one wins
            replaced = os.path.join(parent, temporary_name(name, "old"))
            os.rename(final, replaced)
        os.rename(temporary, final)
        fsync_directory(parent)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    return final


def remove_checkpoint_directory(path: str) -> None:
    """Take a checkpoint out of its directory at once (a rename), then delete its files."""
    parent, name = os.path.split(path)
    doomed = os.path.join(parent, temporary_name(name, "old"))
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return  # another process removed it first
    shutil.rmtree(doomed, ignore_errors=True)


def read_checkpoint_directory(directory: str, wanted: Optional[set] = None) -> Dict[str, Any]:
    """Every file of a checkpoint, checked against its manifest and parsed: arrays by name for
    safetensors, objects for JSON. ``wanted`` limits the rank files read (others are skipped,
    not checked; see ``is_per_rank_file``). Raises ``CheckpointCorruptError`` naming the first bad file, or
    ``CheckpointChangedError`` when a writer removed or replaced the checkpoint meanwhile."""
    try:
        handle = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(directory, "", "no such checkpoint directory") from None
    except OSError as exc:
        raise CheckpointCorruptError(directory, "", f"unreadable ({exc.strerror})") from None
    try:
        return _read_open_directory(directory, handle, wanted)
    except CheckpointCorruptError:
        # A bad file in a directory that is no longer the one at ``directory`` is not damage:
        # a writer renamed it away (removal, rotation) or put a new one in its place.
        if not _still_at(directory, handle):
            raise CheckpointChangedError(directory) from None
        raise
    finally:
        os.close(handle)


def _still_at(directory: str, handle: int) -> bool:
    try:
        now, opened = os.stat(directory), os.fstat(handle)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def _read_file(directory: str, handle: int, file_name: str) -> bytes:
    """One file of the directory opened as ``handle``: all files come from that directory,
    even if another one has taken its name since."""
    try:
        if os.open in os.supports_dir_fd:
            fd = os.open(file_name, os.O_RDONLY, dir_fd=handle)
        else:
            fd = os.open(os.path.join(directory, file_name), os.O_RDONLY)
        with open(fd, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CheckpointCorruptError(directory, file_name, "missing") from None
    except OSError as exc:
        raise CheckpointCorruptError(directory, file_name,
                                     f"unreadable ({exc.strerror})") from None


def _read_open_directory(directory: str, handle: int, wanted: Optional[set]) -> Dict[str, Any]:
    manifest = _read_manifest(directory, _read_file(directory, handle, MANIFEST))
    contents: Dict[str, Any] = {}
    for file_name, entry in manifest["files"].items():
        if wanted is not None and is_per_rank_file(file_name) and file_name not in wanted:
            continue
        data = _read_file(directory, handle, file_name)
        if len(data) != entry["size"]:
            raise CheckpointCorruptError(directory, file_name, f"{len(data)} bytes, the manifest "
                                         f"says {entry['size']} (truncated or rewritten)")
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CheckpointCorruptError(directory, file_name, "SHA-256 differs from the manifest")
        contents[file_name] = _parse(directory, file_name, data)
    if META not in contents:
        raise CheckpointCorruptError(directory, META, "not listed in the manifest")
    return contents


def _parse(directory: str, file_name: str, data: bytes) -> Any:
    try:
        if file_name.endswith(".json"):
            return json.loads(data.decode("utf-8"))
        if file_name.endswith(".safetensors"):
            return load_safetensors(data)
    except Exception as exc:  # safetensors raises its own error type for malformed files
        raise CheckpointCorruptError(directory, file_name, f"bad {file_name.rsplit('.', 1)[1]} "
                                     f"content ({exc})") from None
    return data


def _read_manifest(directory: str, data: bytes) -> Dict[str, Any]:
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointCorruptError(directory, MANIFEST, f"unreadable or bad JSON ({exc})")
    if not isinstance(manifest, dict):
        raise CheckpointCorruptError(directory, MANIFEST, "not a JSON object")
    files = manifest.get("files")
    if manifest.get("format") != FORMAT or not isinstance(files, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("size"), int)
            and isinstance(e.get("sha256"), str) for e in files.values()):
        raise CheckpointCorruptError(directory, MANIFEST, "not a neural_arch checkpoint manifest")
    if manifest.get("version") != VERSION:
        raise CheckpointCorruptError(directory, MANIFEST, f"format version "
                                     f"{manifest.get('version')}, this reader knows {VERSION}")
    if any(os.sep in name or name.startswith(".") for name in files):
        raise CheckpointCorruptError(directory, MANIFEST, "lists a path outside the checkpoint")
    return manifest
