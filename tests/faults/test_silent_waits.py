"""Ranks that wait at the rendezvous say so, and stop waiting with an error that names the place.

A rank whose store never answers (nobody serves it, or the job that served the port ended
while the rank was connecting) says on stderr what it waits for within 10 s and at intervals
after, then ends with an error naming the store's address and port once the rendezvous
timeout (``NEURAL_ARCH_RENDEZVOUS_TIMEOUT``, short here) has passed; a rank whose peers never
come names the ranks still missing. Another job's store that answers with a proof the rank's
secret does not verify ends the rank at once with the foreign-job error, even when that job
ends right after. Each rank is a real process (``tests/waiting_rank.py``).
"""
from __future__ import annotations

import re
import secrets
import selectors
import socket
import threading
import time

import pytest

from dist_harness import free_port
from neural_arch.distributed.errors import AuthenticationError
from neural_arch.distributed.rendezvous.auth import ServerHandshake
from waiting_rank import REPORT_S, TIMEOUT_S, WaitingRank, job_env

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]
FIRST_MESSAGE_S = 10.0
END_SLACK_S = 8.0  # start-up, and the last connection attempt, past the rendezvous timeout
FROZEN_S = 6.0  # how long the ending first job holds a connection without answering it
HELLO_BYTES = 4 + 32  # the handshake's magic and the client's nonce
# Where the default schedule (first message after 5 s) or the frozen connection (FROZEN_S)
# is not part of the case, a shorter report interval (REPORT_S / 2, 1 s) and rendezvous
# timeout still leave at least two report intervals after the last message the case looks for.
SHORT_REPORT_S = REPORT_S / 2
THREE_MESSAGES_TIMEOUT_S = 5 * SHORT_REPORT_S  # messages at 1, 2 and 3 s
ONE_MESSAGE_TIMEOUT_S = 4 * SHORT_REPORT_S  # the first message at 1 s after the wait starts
# The frozen case: the rank outwaits the first job's silent connection (FROZEN_S), then
# finds nobody and waits, saying so, until this timeout
FROZEN_TIMEOUT_S = FROZEN_S + 3.0
# The default schedule's case: its first message comes 5 s into the wait (FIRST_MESSAGE_S
# allows 10 s from the start), and the rendezvous timeout leaves 4 s past that message
DEFAULT_SCHEDULE_TIMEOUT_S = 9.0


def _end_with_store_error(rank: WaitingRank, port: int, timeout_s: float) -> None:
    code = rank.finish(timeout_s + END_SLACK_S)
    log = rank.text()
    assert code == 1, f"exit code {code} (None: still waiting, killed)\n{log}"
    assert rank.ended >= timeout_s - 1.0, log  # it waited the rendezvous timeout, not less
    assert re.search(rf"RendezvousError: .*127\.0\.0\.1:{port}", log), log


@pytest.mark.parametrize("init", ["tcp", "env"])
def test_a_rank_nobody_serves_says_what_it_waits_for_then_fails_naming_the_store(init):
    port = free_port()
    timeout_s = DEFAULT_SCHEDULE_TIMEOUT_S if init == "tcp" else THREE_MESSAGES_TIMEOUT_S
    env = job_env(2, port, timeout_s=timeout_s, report_s=SHORT_REPORT_S)
    args = (f"tcp://127.0.0.1:{port}", "1", "2") if init == "tcp" else ()
    if init == "tcp":
        del env["NEURAL_ARCH_RENDEZVOUS_REPORT"]  # the default schedule: first within 10 s
    rank = WaitingRank(env, 1, *args)
    try:
        first = rank.wait_for_line(re.compile("is waiting"), FIRST_MESSAGE_S + 5)
        assert first and first[0] <= FIRST_MESSAGE_S, rank.text()
        assert f"127.0.0.1:{port}" in first[1] and "rank 1" in first[1], first
        _end_with_store_error(rank, port, timeout_s)
        if init == "env":  # every SHORT_REPORT_S (1 s) after the first
            assert len([line for _, line in rank.lines if "is waiting" in line]) >= 3
    finally:
        rank.stop()


def test_ranks_waiting_for_a_peer_that_never_comes_name_it():
    port = free_port()
    env = job_env(3, port, timeout_s=ONE_MESSAGE_TIMEOUT_S, report_s=SHORT_REPORT_S)
    ranks = [WaitingRank(env, r) for r in (0, 1)]  # rank 2 never starts
    try:
        for rank in ranks:
            first = rank.wait_for_line(re.compile(r"is waiting.*\[2\]"), FIRST_MESSAGE_S + 5)
            assert first and first[0] <= FIRST_MESSAGE_S, rank.text()
        for rank in ranks:
            code = rank.finish(ONE_MESSAGE_TIMEOUT_S + END_SLACK_S)
            log = rank.text()
            # rank 1 may see rank 0, which serves the store, give up first
            assert code == 1 and re.search(r"Error: .*ranks \[2\].* arrived", log), log
    finally:
        for rank in ranks:
            rank.stop()


class _EndingFirstJob:
    """The store of a first job that ends while a rank of a second job authenticates with it:
    after the rank's hello (``"hello"``), after sending its labelled challenge (``"challenge"``,
    whose proof the rank's secret does not verify), or ``FROZEN_S`` after accepting the rank's
    connection without answering it (``"frozen"``). Then its port is free."""

    def __init__(self, port: int, ends_after: str) -> None:
        self.listener = socket.create_server(("127.0.0.1", port))
        self.listener.settimeout(FROZEN_S + 10)
        self.ends_after, self.ended = ends_after, threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            if self.ends_after == "frozen":
                time.sleep(FROZEN_S)
                return
            if self.ends_after == "hello":
                conn.settimeout(10)
                conn.recv(HELLO_BYTES, socket.MSG_WAITALL)
                return
            shake = ServerHandshake(conn, secrets.token_bytes(32), label=b"run:first")
            conn.setblocking(False)
            with selectors.DefaultSelector() as sel:
                sel.register(conn, selectors.EVENT_READ)
                try:
                    while shake.awaiting != "proof" and sel.select(10):
                        shake.step()  # answers the hello with the challenge
                except (AuthenticationError, OSError):
                    pass  # the rank saw the foreign job's challenge and hung up: as meant
        finally:
            self.listener.close()
            conn.close()
            self.ended.set()

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept of a rank never seen
        except OSError:
            pass
        self.listener.close()
        self._thread.join(FROZEN_S + 5)


@pytest.mark.parametrize("ends_after, then", [
    ("challenge", "foreign job"), ("hello", "nobody"), ("hello", "own rank 0"),
    ("frozen", "nobody")])
def test_a_rank_whose_first_job_ends_during_its_rendezvous_never_hangs(ends_after, then):
    port = free_port()
    first = _EndingFirstJob(port, ends_after)
    # a secret of its own; only a rank left with nobody waits the timeout out, and the frozen
    # case keeps a longer one (the rank outwaits FROZEN_S), as does the rank whose rank 0 starts
    short = then == "nobody" and ends_after != "frozen"
    timeout_s = (ONE_MESSAGE_TIMEOUT_S if short else FROZEN_TIMEOUT_S if ends_after == "frozen"
                 else TIMEOUT_S)
    env = job_env(2, port, timeout_s=timeout_s, report_s=SHORT_REPORT_S if short else REPORT_S)
    second = [WaitingRank(env, 1)]
    try:
        assert first.ended.wait(FROZEN_S + 10), second[0].text()
        if then == "foreign job":
            code = second[0].finish(END_SLACK_S)
            log = second[0].text()
            assert code == 1 and re.search(
                rf"RendezvousError: .*says it serves job 'run:first' at 127\.0\.0\.1:{port}",
                log), log
            return
        waiting = second[0].wait_for_line(re.compile("is waiting"), FIRST_MESSAGE_S + 5)
        assert waiting and waiting[0] <= FIRST_MESSAGE_S, second[0].text()
        if then == "nobody":
            _end_with_store_error(second[0], port, timeout_s)
            return
        second.append(WaitingRank(env, 0))  # its own rank 0 gets the port now
        for rank in second:
            code = rank.finish(timeout_s + END_SLACK_S)
            assert code == 0 and "sum 2" in rank.text(), rank.text()
    finally:
        first.close()
        for rank in second:
            rank.stop()
