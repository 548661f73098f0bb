"""The rendezvous timeout (its own setting, apart from the collectives') and the messages of a
rank waiting for the store or for its peers."""
import re
import socket
import threading
import time

import pytest

from neural_arch.distributed.errors import CollectiveTimeoutError, RendezvousError
from neural_arch.distributed.rendezvous.arrival import wait_for_ranks
from neural_arch.distributed.rendezvous.store import TCPStore, barrier
from neural_arch.distributed.rendezvous.waiting import (DEFAULT_TIMEOUT_S, REPORT_ENV,
                                                        TIMEOUT_ENV, WaitReport,
                                                        rendezvous_timeout, report_interval)

pytestmark = pytest.mark.timeout(60)
SECRET = b"waiting-test-secret"


@pytest.fixture(autouse=True)
def quick_reports(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    monkeypatch.setenv(REPORT_ENV, "0.3")


def test_the_rendezvous_waits_minutes_not_the_collectives_half_hour():
    assert DEFAULT_TIMEOUT_S == 600.0
    assert rendezvous_timeout(1800.0, {}) == 600.0  # init_process_group's default timeout
    assert rendezvous_timeout(20.0, {}) == 20.0  # never longer than the timeout given
    assert rendezvous_timeout(1800.0, {TIMEOUT_ENV: "45"}) == 45.0
    assert rendezvous_timeout(1800.0, {TIMEOUT_ENV: "3600"}) == 1800.0
    assert report_interval({}) == 30.0 and report_interval({REPORT_ENV: " 2 "}) == 2.0
    server = TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=1800)
    try:
        assert (server.timeout, server.connect_timeout) == (1800.0, 600.0)
    finally:
        server.close()


@pytest.mark.parametrize("value", ["ten", "0", "-5", "nan", "inf"])
def test_a_malformed_setting_names_the_variable_and_its_value(value, monkeypatch):
    with pytest.raises(ValueError, match=f"{TIMEOUT_ENV}={value!r}"):
        rendezvous_timeout(1800.0, {TIMEOUT_ENV: value})
    monkeypatch.setenv(REPORT_ENV, value)
    with pytest.raises(ValueError, match=f"{REPORT_ENV}={value!r}"):
        TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET)


def test_the_first_message_comes_within_5_s_then_at_each_interval():
    report = WaitReport(3, "for something", 100.0, environ={REPORT_ENV: "60"})
    assert 4.9 < report.until_next() <= 5.0 and not report.say()
    report.started -= 5.0
    assert report.say("detail") and 59 < report.until_next() <= 60


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_client_nobody_serves_says_so_then_names_the_store(monkeypatch, capsys):
    monkeypatch.setenv(TIMEOUT_ENV, "1.5")
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=rf"127\.0\.0\.1:{port} after waiting 1\.5 s.*"
                                              rf"{TIMEOUT_ENV} sets this wait"):
        TCPStore("127.0.0.1", port, secret=SECRET, timeout=1800, rank=1)  # as init does
    assert time.monotonic() - started < 5
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3, lines
    assert re.fullmatch(rf"neural_arch: rank 1 is waiting for the store at 127\.0\.0\.1:{port} "
                        rf"\(rank 0 serves it\) for 0 s so far \(it gives up after 1\.5 s, "
                        rf"{TIMEOUT_ENV}\): last attempt: .*refused", lines[0]), lines[0]


def test_a_server_that_accepts_and_says_nothing_is_waited_out_not_an_auth_error(capsys):
    silent = socket.create_server(("127.0.0.1", 0))  # the backlog accepts; nobody answers
    port = silent.getsockname()[1]
    try:  # each try waits 5 s for the server's challenge: the second one is cut short
        with pytest.raises(RendezvousError, match=rf"127\.0\.0\.1:{port} after waiting 6\.0 s "
                                                  r"\(last error: .*sent no challenge"):
            TCPStore("127.0.0.1", port, secret=SECRET, timeout=6, rank=1)
    finally:
        silent.close()
    assert "is waiting for the store" in capsys.readouterr().err


def test_an_explicit_connect_timeout_is_kept(monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "100")
    with pytest.raises(RendezvousError, match="after waiting 0.5 s"):
        TCPStore("127.0.0.1", _closed_port(), secret=SECRET, timeout=1800, connect_timeout=0.5)


@pytest.fixture
def server():
    store = TCPStore("127.0.0.1", 0, world_size=3, is_server=True, secret=SECRET, timeout=20)
    yield store
    store.close()


def test_a_barrier_says_which_ranks_it_waits_for(server, capsys):
    with pytest.raises(CollectiveTimeoutError, match=r"ranks \[1, 2\] never arrived"):
        barrier(server, "lonely", 3, 0, timeout=1.0)
    err = capsys.readouterr().err
    assert f"rank 0 is waiting at barrier 'lonely' (store 127.0.0.1:{server.port})" in err
    assert "ranks [1, 2] of 3 have not arrived" in err


def test_the_rendezvous_names_the_missing_ranks_on_every_waiting_rank(server, monkeypatch,
                                                                     capsys):
    monkeypatch.setenv(TIMEOUT_ENV, "1.2")
    key = lambda r: f"arrived/{r}"  # noqa: E731
    errors = {}

    def rank_1():
        client = TCPStore("127.0.0.1", server.port, secret=SECRET, timeout=20)
        client.set(key(1), b"1")
        try:
            wait_for_ranks(client, 1, 3, key, ["all"])
        except RendezvousError as e:
            errors[1] = str(e)
        client.close()

    thread = threading.Thread(target=rank_1)
    thread.start()
    server.set(key(0), b"1")
    with pytest.raises(RendezvousError, match=rf"\[rank 0, init_process_group\] the rendezvous "
                                              rf"of 3 ranks at 127\.0\.0\.1:{server.port} timed "
                                              rf"out after 1\.2 s .*ranks \[2\] of 3 have not"):
        wait_for_ranks(server, 0, 3, key)
    thread.join(10)
    assert "ranks [2] of 3 have not arrived" in errors[1]
    err = capsys.readouterr().err
    for rank in (0, 1):
        assert f"rank {rank} is waiting at the rendezvous of 3 ranks" in err
    server.set("all", b"1")  # once rank 0 has heard from all, the others go on at once
    wait_for_ranks(server, 2, 3, key, ["all"])
