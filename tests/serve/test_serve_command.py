"""The command around the endpoint: a folder it cannot serve ends it with status 2 and one line,
and SIGTERM or SIGINT stop it gracefully (a request in flight is answered) leaving nothing."""
from __future__ import annotations

import signal
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from leftovers_fixture import leftovers  # noqa: F401,E402
from serve_support import (Server, close_server, rows_of, run_command,  # noqa: E402
                           save_tiny_model)

from neural_arch.data.tabular import TabularPreprocessor  # noqa: E402
from neural_arch.models.tabgpt import TabGPTConfig, TabGPTForPreTraining  # noqa: E402

pytestmark = pytest.mark.timeout(40)


def test_a_folder_that_does_not_exist_exits_2_with_one_line(tmp_path):
    result = run_command("--model", str(tmp_path / "nowhere"), "--port", "0")
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and "nowhere" in lines[0], lines


def test_a_pretraining_folder_exits_2_saying_it_has_no_head(tmp_path):
    preprocessor = TabularPreprocessor(target="y").fit({"x": [1.0, 2.0, 3.0],
                                                        "y": [0, 1, 0]})
    TabGPTForPreTraining(TabGPTConfig(**preprocessor.model_config(), d_token=8, n_layers=1,
                                      n_heads=2)).save_pretrained(tmp_path,
                                                                  preprocessor=preprocessor)
    result = run_command("--model", str(tmp_path), "--port", "0")
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "TabGPTForPreTraining" in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_after_answering_the_request_in_flight(tmp_path, sig):
    model, preprocessor, table, target = save_tiny_model(str(tmp_path / "wine"), steps=1)
    # a request waits 1.5 s in the batcher for company: the signal comes while it waits
    server = Server(str(tmp_path / "wine"), "--timeout-ms", "1500")
    answer = []
    try:
        client = threading.Thread(target=lambda: answer.append(server.request(
            "POST", "/predict", rows_of(table, target, [0, 1]), timeout=15)))
        client.start()
        deadline = time.monotonic() + 10
        while server.request("GET", "/health")[1]["pending_rows"] < 2:
            assert time.monotonic() < deadline, "the request never reached the batcher"
            time.sleep(0.02)
        status, stderr = server.stop(sig)
        client.join(timeout=15)
    finally:
        close_server(server)
    assert status == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert answer and answer[0][0] == 200, answer
    assert len(answer[0][1]["predictions"]) == 2
