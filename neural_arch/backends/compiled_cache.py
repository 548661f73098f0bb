"""Numba's on-disk cache, kept true to every source file a cached kernel is compiled from.

Numba's cache (``cache=True``) keys a compiled function by its own source file's stamp (mtime
and size) and its signature. A kernel that calls a compiled function of another module, or
reads a constant of another module, carries that module's code in its cached machine code; once
the other module changes and the kernel's own file does not (an in-place upgrade, a ``git pull``
in an editable install), Numba loads the stale kernel and runs the old code against the new
Python side: another layout of shared words, another protocol, a hang or wrong data.

``refresh_if_stale`` closes that gap for a group of dispatchers: it hashes the contents of the
source files they are built from and compares the digest with the one recorded beside their
cache (``<name>.sources-digest`` in the folder Numba caches them in). When the digests differ
it drops the group's cache entries before their first use (``Dispatcher.recompile``, Numba's
public way to flush a cache), so they compile afresh and are cached anew, and then records the
new digest. Call it once, before the group runs.

Several processes may do this at once (the ranks of a job import together): each one that reads
an old digest flushes before recording the new one, so none that reads the new digest can load
an entry compiled from the old sources; Numba writes its index and data files by renaming
temporary files, and so does this module, so nobody reads half a file. The price of a race is a
needless recompile. A cache folder that cannot be written (a read-only install: Numba then
caches elsewhere or not at all) never raises here; a stale cache that cannot be flushed is
bypassed instead (see ``_bypass``).
"""
from __future__ import annotations

import hashlib
import os
import threading
import uuid
from typing import Any, Dict, Iterable, List, Sequence

SUFFIX = ".sources-digest"

_lock = threading.Lock()
_refreshed: Dict[str, bool] = {}  # stamp name -> whether this process flushed that group


def sources_digest(paths: Sequence[str]) -> str:
    """The SHA-256 of the files at ``paths`` (their names and contents, in this order); a file
    that cannot be read counts by the reason, so the digest still changes when it appears."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as source:
                content = source.read()
        except OSError as exc:
            content = f"unreadable: {type(exc).__name__}".encode()
        name = os.path.basename(path).encode()
        digest.update(len(name).to_bytes(8, "little") + name)
        digest.update(len(content).to_bytes(8, "little") + content)
    return digest.hexdigest()


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


def _bypass(dispatcher: Any) -> None:
    """Compile ``dispatcher`` afresh in this process without reading its stale cache, whose
    index could not be rewritten. Numba has no public switch for one dispatcher's cache, so this
    reaches its ``_cache`` (a ``numba.core.caching.Cache``, whose ``disable`` is public there);
    where that attribute is missing the dispatcher is left as it is."""
    cache = getattr(dispatcher, "_cache", None)
    disable = getattr(cache, "disable", None)
    if callable(disable):
        disable()


def refresh_if_stale(dispatchers: Iterable[Any], sources: Sequence[str], name: str) -> bool:
    """Drop the cached machine code of ``dispatchers`` when the files ``sources`` (every file
    their code is compiled from, their own included) changed since it was cached; ``name``
    names the group's digest file (unique within the cache folder, e.g. the module's name).
    Returns whether this call flushed. Once per process and ``name``; later calls return the
    first answer at once."""
    with _lock:
        if name in _refreshed:
            return _refreshed[name]
        cached = [(d, _cache_folder(d)) for d in dispatchers]
        cached = [(d, folder) for d, folder in cached if folder]
        folders = sorted({folder for _, folder in cached})
        if not folders:
            _refreshed[name] = False
            return False
        digest = sources_digest(sources)
        stamps = [os.path.join(folder, name + SUFFIX) for folder in folders]
        stale = any(_read(stamp) != digest for stamp in stamps)
        if stale:
            for dispatcher, _ in cached:
                try:
                    dispatcher.recompile()  # before first use: flushes, compiles nothing
                except OSError:
                    _bypass(dispatcher)
            for stamp in stamps:
                _record(stamp, digest)
        _refreshed[name] = stale
        return stale


def forget() -> None:
    """Let ``refresh_if_stale`` check every group again (tests)."""
    with _lock:
        _refreshed.clear()


__all__ = ["SUFFIX", "forget", "module_dispatchers", "refresh_if_stale", "sources_digest"]
