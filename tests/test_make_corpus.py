"""scripts/make_corpus.py as the GPT run benchmark uses it: a >= 1 MB text, the same bytes from
every run of the same Python, and a clear refusal when the asked-for size cannot be reached.
Each call is its own interpreter: the script imports the whole standard library."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(180)
SCRIPT = REPO_ROOT / "scripts" / "make_corpus.py"


def _make(out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def test_default_text_is_at_least_one_megabyte_and_the_same_every_time(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    runs = [_make(first), _make(second)]
    for run in runs:
        assert run.returncode == 0, run.stdout + run.stderr
    data = first.read_bytes()
    assert len(data) >= 1_000_000
    assert second.read_bytes() == data  # deterministic across interpreters
    text = data.decode("utf-8")
    counts = re.search(r"([\d,]+) bytes, ([\d,]+) characters, (\d+) distinct characters",
                       runs[0].stdout)
    assert counts, runs[0].stdout
    assert [int(g.replace(",", "")) for g in counts.groups()] == \
        [len(data), len(text), len(set(text))]
    # the language reference first, the modules' docstrings after it
    assert 'The "assert" statement' in text[:2000]
    assert "Return the cosine of x" in text  # math.cos's docstring


def test_an_unreachable_size_is_refused_with_the_sizes_and_nothing_written(tmp_path):
    out = tmp_path / "corpus.txt"
    run = _make(out, "--min-bytes", str(10 ** 12))
    assert run.returncode == 2
    assert "1,000,000,000,000" in run.stderr and "fewer than --min-bytes" in run.stderr, \
        run.stderr
    assert len(run.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert not out.exists()
