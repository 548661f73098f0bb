"""How long a rank waits at the rendezvous, and what it says on stderr while it waits.

Two waits make up the rendezvous: connecting to rank 0's store (nobody may serve it yet, or
ever) and waiting for every other rank to join it. Both are bounded by the rendezvous timeout,
``NEURAL_ARCH_RENDEZVOUS_TIMEOUT`` seconds, 600 (10 minutes) unless set, and never longer than
the timeout given to ``init_process_group`` (or to the store). That timeout, 1800 s by default,
stays the collectives' own: a step of a large model may well take many minutes, whereas ranks
that have not met after 10 minutes are not coming, and a typo in MASTER_ADDR should not cost
half an hour.

A waiting rank says what it waits for (the store's address and port, its rank, the ranks not
yet arrived) and for how long so far: after 5 s, then every ``NEURAL_ARCH_RENDEZVOUS_REPORT``
seconds (30 unless set; a shorter setting also brings the first message forward).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Mapping, Optional, TextIO

TIMEOUT_ENV = "NEURAL_ARCH_RENDEZVOUS_TIMEOUT"
REPORT_ENV = "NEURAL_ARCH_RENDEZVOUS_REPORT"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_REPORT_S = 30.0
FIRST_REPORT_S = 5.0


def _setting(name: str, default: float, environ: Optional[Mapping[str, str]]) -> float:
    environ = os.environ if environ is None else environ
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if not 0 < value < 1e7:  # also rejects NaN
        raise ValueError(f"{name}={text!r} must be a positive number of seconds below 1e7")
    return value


def rendezvous_timeout(limit: float, environ: Optional[Mapping[str, str]] = None) -> float:
    """Seconds to wait for the store to answer and for the other ranks to arrive: the
    rendezvous timeout, but no more than ``limit`` (the collectives' or the store's timeout)."""
    return min(limit, _setting(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, environ))


def report_interval(environ: Optional[Mapping[str, str]] = None) -> float:
    """Seconds between two messages of a waiting rank."""
    return _setting(REPORT_ENV, DEFAULT_REPORT_S, environ)


class WaitReport:
    """The messages of one wait of at most ``limit`` seconds: ``say`` prints when one is due,
    so a wait loop calls it on every turn and sleeps no longer than ``until_next`` between
    turns. ``setting`` names the variable that set ``limit``, if one did."""

    def __init__(self, rank: Optional[int], what: str, limit: float, setting: str = "",
                 environ: Optional[Mapping[str, str]] = None,
                 stream: Optional[TextIO] = None) -> None:
        self.rank, self.who = rank, "a rank" if rank is None else f"rank {rank}"
        self.what, self.limit = what, limit
        self.setting = setting
        self.interval = report_interval(environ)
        self.started = time.monotonic()
        self._due = min(FIRST_REPORT_S, self.interval)
        self._stream = stream

    def set_by(self) -> str:
        """For an error: the variable that set the limit, when one did."""
        return f" ({self.setting} sets this wait)" if self.setting else ""

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def until_next(self) -> float:
        """Seconds until the next message is due (0 when it is due now)."""
        return max(0.0, self._due - self.elapsed())

    def say(self, detail: str = "") -> bool:
        """Print the message if it is due; True when it printed."""
        elapsed = self.elapsed()
        if elapsed < self._due:
            return False
        while self._due <= elapsed:
            self._due += self.interval
        stream = sys.stderr if self._stream is None else self._stream
        print(f"neural_arch: {self.who} is waiting {self.what} for {elapsed:.0f} s so far "
              f"(it gives up after {self.limit:g} s{', ' + self.setting if self.setting else ''})"
              + (f": {detail}" if detail else ""), file=stream, flush=True)
        return True
