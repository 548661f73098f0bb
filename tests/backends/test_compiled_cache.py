"""Numba's cache and the other modules a cached kernel is built from (``compiled_cache``).

Two modules in a temporary folder, as an in-place upgrade leaves them: ``callee`` (a cached
kernel returning a constant) and two cached callers of it, one plain and one guarded by
``refresh_if_stale``. After ``callee``'s constant changes, a fresh process still runs the plain
caller's stale machine code (Numba stamps only the caller's own file), while the guarded caller
compiles afresh, in several processes importing at once, and the next process loads it from the
cache again.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from neural_arch.backends import compiled_cache, numba_backend

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


def _start(folder) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), *sys.path])
    return subprocess.Popen([sys.executable, str(folder / "main.py")], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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


class _Dispatcher:
    """A stand-in caching dispatcher: its cache folder, and whether it was flushed."""

    def __init__(self, folder, fails: bool = False) -> None:
        self.stats = SimpleNamespace(cache_path=None if folder is None else str(folder))
        self.fails, self.flushed = fails, 0
        self._cache = SimpleNamespace(disable=self._disable)
        self.disabled = False

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
