"""Numba's on-disk cache, kept true to every source file a cached kernel is compiled from.

Numba's cache (``cache=True``) keys a compiled function by its own source file's stamp (mtime
and size) and its signature. A kernel that calls a compiled function of another module, or
reads a constant of another module, carries that module's code in its cached machine code; once
the other module changes and the kernel's own file does not (an in-place upgrade, a ``git pull``
in an editable install), Numba loads the stale kernel and runs the old code against the new
Python side: another layout of shared words, another protocol, a hang or wrong data.

``refresh_if_stale`` closes that gap for a group of dispatchers. It compares three digests of
the source files they are built from: the files as this process imported them (hashed by
``remember`` when the modules are imported, else at the first refresh), the files on disk now,
and the digest recorded beside the group's cache (``<name>.sources-digest`` in the folder
Numba caches them in). Where the files changed since this process imported them, it runs code
that no longer matches any file: its dispatchers then compile in memory and neither load nor
save cache entries. Otherwise, where the recorded digest differs, it drops the group's cache
entries before their first use (``Dispatcher.recompile``, Numba's public way to flush a cache),
so they compile afresh, and records the digest. From then on each load or save of a cache entry
of the group, which Numba does at every new signature's first compile, happens only while the
recorded digest is still this process's: a process left running the old code after an upgrade
neither saves its machine code over a cache refreshed for the new files nor loads the new code.

Several processes may do this at once (the ranks of a job import together). A refresh's flush
and record, and each guarded load and save, hold a lock file beside the digest
(``<name>.sources-digest.lock``, ``fcntl.flock``), so no save lands between another process's
flush and its record: among processes that guard a cache this way, none that reads the new
digest loads an entry compiled from the old sources. Where ``fcntl`` is missing the same steps
run unlocked, and a narrow race remains. Numba writes its index and data files by renaming
temporary files, and so does this module, so nobody reads half a file. The price of a race is a
needless recompile. A file changed in the instant between Python reading it and ``remember``
hashing it goes unseen. A cache folder that cannot be written (a read-only install: Numba then
caches elsewhere or not at all) never raises here; a stale cache that cannot be flushed, or
whose loads and saves cannot be guarded (Numba's ``_cache`` changed), is bypassed instead (see
``_bypass``).
"""
from __future__ import annotations

import hashlib
import os
import threading
import uuid
from typing import Any, Dict, Iterable, List, Sequence

from .cache_lock import locked

SUFFIX = ".sources-digest"
LOCK_SUFFIX = ".lock"

_lock = threading.RLock()  # held while refreshing, which remembers too
_refreshed: Dict[str, bool] = {}  # stamp name -> whether this process flushed that group
_imported: Dict[str, str] = {}  # absolute path -> hash of the file as this process imported it


def _file_hash(path: str) -> str:
    """The SHA-256 of the file at ``path``; one that cannot be read hashes the reason, so the
    digest still changes when it appears."""
    try:
        with open(path, "rb") as source:
            content = source.read()
    except OSError as exc:
        content = f"unreadable: {type(exc).__name__}".encode()
    return hashlib.sha256(content).hexdigest()


def _combined(paths: Sequence[str], hashes: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for path, file_hash in zip(paths, hashes):
        name = os.path.basename(path).encode()
        digest.update(len(name).to_bytes(8, "little") + name + file_hash.encode("ascii"))
    return digest.hexdigest()


def sources_digest(paths: Sequence[str]) -> str:
    """The digest of the files at ``paths`` as they are now (their names and contents, in this
    order)."""
    return _combined(paths, [_file_hash(path) for path in paths])


def remember(paths: Iterable[str]) -> None:
    """Hash the files at ``paths`` now, as the versions this process imports, unless they are
    hashed already. Call it while importing the modules a cached group is built from (before,
    for a module imported later): ``refresh_if_stale`` then checks the cache against the code
    this process runs, not against files changed since."""
    with _lock:
        for path in paths:
            key = os.path.abspath(path)
            if key not in _imported:  # not setdefault: that would hash the file every time
                _imported[key] = _file_hash(path)


def imported_digest(paths: Sequence[str]) -> str:
    """The digest of the files at ``paths`` as ``remember`` hashed them (those it has not,
    hashed now and remembered)."""
    remember(paths)
    with _lock:
        return _combined(paths, [_imported[os.path.abspath(path)] for path in paths])


def module_dispatchers(module: Any) -> List[Any]:
    """The Numba dispatchers ``module`` defines (not those it imports from elsewhere)."""
    found = []
    for value in vars(module).values():
        py_func = getattr(value, "py_func", None)
        if (callable(getattr(value, "recompile", None)) and py_func is not None
                and getattr(py_func, "__module__", None) == module.__name__):
            found.append(value)
    return found


def _cache_folder(dispatcher: Any) -> Any:
    """The folder ``dispatcher`` caches in, or None when it does not cache."""
    try:
        return dispatcher.stats.cache_path
    except AttributeError:  # not a caching dispatcher
        return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as stamp:
            return stamp.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""  # none yet, or unreadable: stale


def _record(path: str, digest: str) -> None:
    """Write ``digest`` to ``path`` whole (through a temporary file renamed over it)."""
    temporary = f"{path}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    try:
        with open(temporary, "w", encoding="ascii") as stamp:
            stamp.write(digest + "\n")
        os.replace(temporary, path)
    except OSError:
        pass  # a folder we may not write: the next process flushes again, needlessly
    finally:
        if os.path.lexists(temporary):
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _lock_paths(stamps: Sequence[str]) -> List[str]:
    """The lock files beside the digest files ``stamps``."""
    return [stamp + LOCK_SUFFIX for stamp in stamps]


def _bypass(dispatcher: Any) -> None:
    """Compile ``dispatcher`` in this process without reading or writing its cache (stale, or
    not ours to touch). Numba has no public switch for one dispatcher's cache, so this reaches
    its ``_cache`` (a ``numba.core.caching.Cache``, whose ``disable`` is public there); where
    that attribute is missing the dispatcher is left as it is."""
    cache = getattr(dispatcher, "_cache", None)
    disable = getattr(cache, "disable", None)
    if callable(disable):
        disable()


def _guard(dispatcher: Any, stamps: List[str], digest: str) -> bool:
    """Let ``dispatcher`` load and save cache entries only while every file ``stamps`` holds
    ``digest``, checked under their locks; False (nothing changed) where its ``_cache`` has no
    ``load_overload`` and ``save_overload`` to wrap. Numba calls them at each new signature's
    first compile, with its compiler lock held."""
    cache = getattr(dispatcher, "_cache", None)
    load = getattr(cache, "load_overload", None)
    save = getattr(cache, "save_overload", None)
    if not (callable(load) and callable(save)):
        return False
    locks = _lock_paths(stamps)

    def ours() -> bool:
        return all(_read(stamp) == digest for stamp in stamps)

    def guarded_load(sig: Any, target_context: Any) -> Any:
        with locked(locks) as held:
            return load(sig, target_context) if held and ours() else None  # None: compile

    def guarded_save(sig: Any, data: Any) -> None:
        with locked(locks) as held:
            if held and ours():
                save(sig, data)

    try:
        cache.load_overload, cache.save_overload = guarded_load, guarded_save
    except AttributeError:  # a cache object that takes no attributes
        return False
    return True


def refresh_if_stale(dispatchers: Iterable[Any], sources: Sequence[str], name: str) -> bool:
    """Drop the cached machine code of ``dispatchers`` when the files ``sources`` (every file
    their code is compiled from, their own included) changed since it was cached, and guard
    their later loads and saves (see the module's docstring); ``name`` names the group's digest
    file (unique within the cache folder, e.g. the module's name). Call it before the group
    first runs. Returns whether this call flushed. Once per process and ``name``; later calls
    return the first answer at once."""
    with _lock:
        if name in _refreshed:
            return _refreshed[name]
        cached = [(d, _cache_folder(d)) for d in dispatchers]
        cached = [(d, folder) for d, folder in cached if folder]
        folders = sorted({folder for _, folder in cached})
        if not folders:
            _refreshed[name] = False
            return False
        digest = imported_digest(sources)
        stamps = [os.path.join(folder, name + SUFFIX) for folder in folders]
        group = [dispatcher for dispatcher, _ in cached]
        if sources_digest(sources) != digest:  # this process runs code no file holds any more
            for dispatcher in group:
                _bypass(dispatcher)
            _refreshed[name] = False
            return False
        with locked(_lock_paths(stamps)) as held:
            stale = held and any(_read(stamp) != digest for stamp in stamps)
            if stale:
                for dispatcher in group:
                    try:
                        dispatcher.recompile()  # before first use: flushes, compiles nothing
                    except OSError:
                        _bypass(dispatcher)
                for stamp in stamps:
                    _record(stamp, digest)
            if not held or not all([_guard(d, stamps, digest) for d in group]):
                for dispatcher in group:  # unchecked loads and saves could mix old and new code
                    _bypass(dispatcher)
        _refreshed[name] = stale
        return stale


def forget() -> None:
    """Let ``refresh_if_stale`` check every group again, and ``remember`` hash every file again,
    as a new process would (tests)."""
    with _lock:
        _refreshed.clear()
        _imported.clear()


__all__ = ["LOCK_SUFFIX", "SUFFIX", "forget", "imported_digest", "module_dispatchers",
           "refresh_if_stale", "remember", "sources_digest"]
