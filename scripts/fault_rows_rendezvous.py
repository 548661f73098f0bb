"""Row runners for ranks left waiting at the rendezvous: a rank whose store never answers.

Each runner injects its fault once into fresh processes and returns a ``Run`` (``fault_rows``).
The rank is ``tests/waiting_rank.py``, with the rendezvous timeout shortened to
``waiting_rank.TIMEOUT_S`` and the waiting messages on their default schedule.
"""
from __future__ import annotations

import re
from pathlib import Path

from dist_harness import free_port
from fault_rows import Run
from waiting_rank import TIMEOUT_S, WAITING, WaitingRank, job_env

FIRST_MESSAGE_S = 10.0  # a waiting rank must say so within this
END_SLACK_S = 8.0  # start-up, and the last connection attempt, past the rendezvous timeout


def store_never_answers(tmp: Path) -> Run:
    """Rank 1 of 2 joins ``tcp://127.0.0.1:<port>`` (as ``train_gpt --rank 1`` does) where
    nobody listens. The time is that of its first waiting message; the row passes when that
    came within 10 s naming the store and the rank, and the rank then ended with an error
    naming the store's address and port within its rendezvous timeout."""
    port = free_port()
    env = job_env(2, port)
    del env["NEURAL_ARCH_RENDEZVOUS_REPORT"]  # the default schedule
    rank = WaitingRank(env, 1, f"tcp://127.0.0.1:{port}", "1", "2")
    try:
        first = rank.wait_for_line(WAITING, TIMEOUT_S)
        code = rank.finish(TIMEOUT_S + END_SLACK_S)
    finally:
        rank.stop()
    log = rank.text()
    store = f"127.0.0.1:{port}"
    if first is None:
        return Run(None, False, f"no waiting message (exit code {code}): {log[-200:]}",
                   [rank.proc.pid])
    seconds, line = first
    said = store in line and "rank 1" in line
    ended = re.search(rf"RendezvousError: .*{re.escape(store)}", log) is not None
    ok = said and ended and code == 1 and seconds <= FIRST_MESSAGE_S
    ends = (f"ended after {rank.ended:.1f} s with exit code {code}" if rank.ended is not None
            else f"was still waiting after {TIMEOUT_S + END_SLACK_S:g} s (killed)")
    return Run(seconds, ok, f"said it waits for the store at {store} as rank 1 "
               f"{'(store and rank named)' if said else '(without naming both)'}; {ends}, "
               f"{'naming' if ended else 'not naming'} the store's address and port "
               f"(rendezvous timeout {TIMEOUT_S:g} s)", [rank.proc.pid])
