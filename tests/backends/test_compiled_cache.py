"""Numba's cache and the other modules a cached kernel is built from (``compiled_cache``).

Two modules in a temporary folder, as an in-place upgrade leaves them: ``callee`` (a cached
kernel returning a constant) and two cached callers of it, one plain and one guarded by
``refresh_if_stale``. After ``callee``'s constant changes, a fresh process still runs the plain
caller's stale machine code (Numba stamps only the caller's own file), while the guarded caller
compiles afresh, in several processes importing at once, and the next process loads it from the
cache again. A process still running the old code after another one refreshed the cache
neither loads the new machine code nor saves its own into it.
"""
from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from neural_arch.backends import cache_lock, compiled_cache, numba_backend

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not numba_backend.is_available(),
                                 reason="Numba is not installed or is switched off")]

CALLEE = "from numba import njit\n\n\n@njit(cache=True)\ndef value():\n    return {}\n"
CALLER = """\
import sys

from numba import njit

import callee
from callee import value
from neural_arch.backends.compiled_cache import module_dispatchers, refresh_if_stale


@njit(cache=True)
def result():
    return value() + 0
"""
GUARD = """
refresh_if_stale(module_dispatchers(sys.modules[__name__]), [__file__, callee.__file__],
                 __name__)
"""
MAIN = """\
import caller_guarded, caller_plain
print(caller_plain.result(), caller_guarded.result(),
      sum(caller_guarded.result.stats.cache_hits.values()))
"""


def _write(path, text: str) -> None:
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def modules(tmp_path):
    _write(tmp_path / "callee.py", CALLEE.format(1))
    _write(tmp_path / "caller_plain.py", CALLER)
    _write(tmp_path / "caller_guarded.py", CALLER + GUARD)
    _write(tmp_path / "main.py", MAIN)
    return tmp_path


def _start(folder, script: str = "main.py", **popen) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *sys.path])
    return subprocess.Popen([sys.executable, str(folder / script)], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _results(*processes: subprocess.Popen) -> list:
    """Each process's (plain result, guarded result, the guarded one's cache hits)."""
    results = []
    for process in processes:
        out, err = process.communicate(timeout=40)
        assert process.returncode == 0, f"main.py exited {process.returncode}: {err[-2000:]}"
        results.append(tuple(int(word) for word in out.split()))
    return results


def test_a_changed_callee_is_compiled_afresh_only_with_the_guard(modules):
    assert _results(_start(modules)) == [(1, 1, 0)]  # compiled and cached
    _write(modules / "callee.py", CALLEE.format(22))  # the callers' files stay as they were
    # ranks importing at once: each may flush (a needless recompile), none runs the old code
    after = _results(*[_start(modules) for _ in range(2)])
    assert [(plain, guarded) for plain, guarded, _ in after] == [(1, 22)] * 2, (
        "the plain caller runs the callee's old constant 1 from Numba's cache (the gap the "
        "guard closes); the guarded one must see 22")
    # the normal path: the digest matches, the new machine code is loaded from the cache
    assert _results(_start(modules)) == [(1, 22, 1)]


# the same guard on a kernel taking an argument: each new argument type compiles (or loads)
# lazily, long after the process imported its code and refreshed the cache
SHIFTER = CALLER.replace("def result():\n    return value() + 0",
                         "def result(x):\n    return x + value()") + GUARD
# each process imports Numba at once, then waits for its turn: the three start together
WAIT = """\
import sys

import numba
import numpy as np

import neural_arch.backends.compiled_cache

sys.stdin.readline()
"""
OLD = """\
import sys

import numpy as np

import shifter
print(shifter.result(1), flush=True)
sys.stdin.readline()  # meanwhile callee.py changes and a new process refreshes the cache
print(shifter.result(1.5), shifter.result(np.float32(0.5)), flush=True)
"""
NEW = WAIT + "import shifter\nprint(shifter.result(1), shifter.result(1.5))\n"
LATER = WAIT + "import shifter\nprint(shifter.result(np.float32(0.5)))\n"


def _line(process: subprocess.Popen, timeout: float = 40.0) -> str:
    """The next line ``process`` prints, waited for at most ``timeout`` seconds."""
    if not select.select([process.stdout], [], [], timeout)[0]:
        raise AssertionError(f"no line from the old process within {timeout} s")
    return process.stdout.readline().strip()


def _output(process: subprocess.Popen) -> str:
    """What ``process`` prints once told to go on."""
    out, err = process.communicate(input="go\n", timeout=40)
    assert process.returncode == 0, f"exited {process.returncode}: {err[-2000:]}"
    return out.strip()


def test_a_process_running_the_old_code_neither_loads_nor_saves_after_a_refresh(modules):
    for name, text in (("shifter.py", SHIFTER), ("old.py", OLD), ("new.py", NEW),
                       ("later.py", LATER)):
        _write(modules / name, text)
    processes = [_start(modules, script, stdin=subprocess.PIPE)
                 for script in ("old.py", "new.py", "later.py")]
    old, new, later = processes
    try:
        assert _line(old) == "2"  # imported with the callee's constant 1
        _write(modules / "callee.py", CALLEE.format(20))  # shifter.py stays as it was
        assert _output(new) == "21 21.5"  # refreshed, cached anew
        assert _output(old) == "2.5 1.5", (
            "the old process loaded the machine code the new one cached (21.5 = 1.5 + 20)")
        assert _output(later) == "20.5", (
            "the old process saved its float32 result(x), built with the constant 1, into the "
            "cache the new one had refreshed, and a later process loaded it")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=10)


class _Dispatcher:
    """A stand-in caching dispatcher: its cache folder, whether it was flushed or its cache
    disabled, and (``entries``) what its cache saved, loaded by signature."""

    def __init__(self, folder, fails: bool = False, guardable: bool = True) -> None:
        self.stats = SimpleNamespace(cache_path=None if folder is None else str(folder))
        self.fails, self.flushed = fails, 0
        self.disabled, self.entries = False, {}
        self._cache = SimpleNamespace(disable=self._disable)
        if guardable:
            self._cache.load_overload = lambda sig, target_context: self.entries.get(sig)
            self._cache.save_overload = self.entries.__setitem__

    def recompile(self) -> None:
        if self.fails:
            raise PermissionError(13, "Permission denied", "index")
        self.flushed += 1

    def _disable(self) -> None:
        self.disabled = True


@pytest.fixture
def fresh_groups():
    compiled_cache.forget()
    yield
    compiled_cache.forget()


def test_flushes_on_a_changed_source_only(tmp_path, fresh_groups):
    source, cache = tmp_path / "dep.py", tmp_path / "cache"
    source.write_text("A = 1\n")
    cache.mkdir()
    kernel = _Dispatcher(cache)
    assert compiled_cache.refresh_if_stale([kernel], [str(source)], "group")
    assert (kernel.flushed, compiled_cache.refresh_if_stale([kernel], [str(source)], "group")) \
        == (1, True)  # once per process
    compiled_cache.forget()
    assert not compiled_cache.refresh_if_stale([kernel], [str(source)], "group")
    source.write_text("A = 2\n")
    compiled_cache.forget()
    assert compiled_cache.refresh_if_stale([kernel], [str(source)], "group")
    assert kernel.flushed == 2
    assert (cache / f"group{compiled_cache.SUFFIX}").read_text().strip() == \
        compiled_cache.sources_digest([str(source)])


def test_no_cache_or_a_read_only_one_never_raises(tmp_path, fresh_groups):
    source = tmp_path / "dep.py"
    source.write_text("A = 1\n")
    not_caching = _Dispatcher(None)
    assert not compiled_cache.refresh_if_stale([not_caching], [str(source)], "none")
    assert not_caching.flushed == 0
    missing = _Dispatcher(tmp_path / "no such folder", fails=True)  # nothing may be written
    assert compiled_cache.refresh_if_stale([missing], [str(source), str(tmp_path / "gone.py")],
                                           "read-only")
    assert missing.disabled, "a stale cache that cannot be flushed must not be loaded"
    assert not os.path.exists(tmp_path / "no such folder")


def _group(folder, **kwargs):
    """A source file, the group's stamp, and a stand-in dispatcher of the group."""
    folder.mkdir(exist_ok=True)
    source, cache = folder / "dep.py", folder / "cache"
    source.write_text("A = 1\n")
    cache.mkdir()
    return source, cache / f"group{compiled_cache.SUFFIX}", _Dispatcher(cache, **kwargs)


def test_loads_and_saves_only_while_the_recorded_digest_is_this_processes(tmp_path,
                                                                           fresh_groups,
                                                                           monkeypatch):
    source, stamp, kernel = _group(tmp_path)
    assert compiled_cache.refresh_if_stale([kernel], [str(source)], "group")
    kernel._cache.save_overload("int64", "code 1")
    assert (kernel.entries, kernel._cache.load_overload("int64", None)) == (
        {"int64": "code 1"}, "code 1")
    recorded = stamp.read_text()
    stamp.write_text("the digest another process recorded\n")  # it flushed: not ours now
    kernel._cache.save_overload("float64", "code 1")
    assert kernel.entries == {"int64": "code 1"}, "saved over another process's refresh"
    assert kernel._cache.load_overload("int64", None) is None, "loaded another process's code"
    stamp.write_text(recorded)
    with open(f"{stamp}{compiled_cache.LOCK_SUFFIX}", "a") as lock:  # another process holds it
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        monkeypatch.setattr(cache_lock, "TIMEOUT_S", 0.05)
        kernel._cache.save_overload("float64", "code 1")
    assert kernel.entries == {"int64": "code 1"}, "saved without the lock"
    assert not kernel.disabled


def test_files_changed_since_import_or_unguardable_caches_are_bypassed(tmp_path, fresh_groups):
    source, stamp, kernel = _group(tmp_path)
    compiled_cache.remember([str(source)])  # as imported
    source.write_text("A = 2\n")
    assert not compiled_cache.refresh_if_stale([kernel], [str(source)], "group")
    assert (kernel.flushed, kernel.disabled, stamp.exists()) == (0, True, False), (
        "the code this process imported is in no file: its cache must stay untouched")
    compiled_cache.forget()
    _, _, unguardable = _group(tmp_path / "other", guardable=False)
    assert compiled_cache.refresh_if_stale([unguardable], [str(source)], "group")
    assert unguardable.disabled, "loads and saves that cannot be checked must not happen"
