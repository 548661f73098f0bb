"""``python -m neural_arch.serve`` as a real process on a tiny saved TabGPT: concurrent clients
each get exactly their own rows' predictions, equal to the model's in-process ones; regression
answers in the target's units; a bad request is a 400 naming the problem."""
from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from leftovers_fixture import leftovers  # noqa: F401,E402
from serve_support import (Server, close_server, in_process_scores, rows_of,  # noqa: E402
                           save_tiny_model)

pytestmark = pytest.mark.timeout(40)


def _softmax(scores):
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


@pytest.mark.slow
def test_concurrent_clients_each_get_their_own_rows(tmp_path):
    model, preprocessor, table, target = save_tiny_model(str(tmp_path / "wine"))
    expected = _softmax(in_process_scores(model, preprocessor, table))
    columns = preprocessor.numerical_columns + preprocessor.categorical_columns
    # 16 clients, 1 to 4 rows each, every client other rows; half send lists in column order
    requests = [list(range(7 * c, 7 * c + 1 + c % 4)) for c in range(16)]
    answers = [None] * len(requests)
    server = Server(str(tmp_path / "wine"), "--max-batch-size", "8", "--timeout-ms", "200")
    try:
        start = threading.Barrier(len(requests))

        def client(c):
            rows = rows_of(table, target, requests[c])
            if c % 2:
                rows = [[row[name] for name in columns] for row in rows]
            start.wait(timeout=10)
            answers[c] = server.request("POST", "/predict", {"rows": rows} if c % 4 == 1
                                        else rows)
        threads = [threading.Thread(target=client, args=(c,)) for c in range(len(requests))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
        status, health = server.request("GET", "/health")
        recorded = health["batcher_latency_ms"]["recorded"]
        window = server.request("GET", f"/health?pieces_since={recorded}&batches_since=0")
        refused = server.request("GET", "/health?pieces_since=-1")
    finally:
        close_server(server)
    for indices, (status, body) in zip(requests, answers):
        assert status == 200, body
        np.testing.assert_allclose(body["probabilities"], expected[indices], rtol=0, atol=1e-6)
        labels = preprocessor.decode_target(expected[indices].argmax(axis=1))
        assert body["predictions"] == [str(label) for label in labels]
        assert body["classes"] == preprocessor.target_labels
    # the rows went through the batcher together: fewer model calls than requests
    assert 0 < health["batches_run"] < len(requests), health
    # every request timed in the batcher, every batch's model call; a window from a count on
    assert health["batcher_latency_ms"]["count"] == recorded == len(requests), health
    assert health["model_call_ms"]["count"] == health["batches_run"], health
    assert window[1]["batcher_latency_ms"]["count"] == 0, window
    assert window[1]["model_call_ms"]["count"] == health["batches_run"], window
    assert refused[0] == 400 and "pieces_since must be an integer >= 0" in refused[1]["error"]


@pytest.mark.slow
def test_regression_answers_in_the_targets_units_and_splits_large_requests(tmp_path):
    model, preprocessor, table, target = save_tiny_model(str(tmp_path / "diabetes"),
                                                         name="diabetes")
    expected = preprocessor.decode_target(in_process_scores(model, preprocessor, table)[:, 0])
    server = Server(str(tmp_path / "diabetes"), "--max-batch-size", "4", "--timeout-ms", "1")
    try:
        # 10 rows: more than one batch holds, run as pieces of 4 and answered in order
        status, body = server.request("POST", "/predict", rows_of(table, target, range(10)))
    finally:
        close_server(server)
    assert status == 200, body
    assert set(body) == {"predictions"}
    np.testing.assert_allclose(body["predictions"], expected[:10], rtol=1e-6)
    assert np.ptp(body["predictions"]) > 0  # the rows' own values, not one repeated


BAD_REQUESTS = [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[]", "non-empty JSON list"),
    (b'{"data": []}', "{\"rows\": [...]}"),
    (b'[{"alcohol": NaN}]', "NaN"),
    ("unknown", "unknown column 'vintage'"),
    ("target", "unknown column 'target' (the target"),
    ("absent", "lacks column 'cellar'"),
    ("text in a number", "column 'alcohol': \"strong\" is not a number"),
    ("bool in a number", "column 'alcohol': true is not a number"),
    ("huge number", "row 0, column 'magnesium': 1e+300 is out of range"),
    ("object in a category", "column 'cellar': {\"a\": 1} is not a category"),
    ("short list", "row 0 has 3 values; the model has 14 columns"),
    ("mixed", "row 1 is [1, 2]"),
]


def _bad_body(kind, row):
    if isinstance(kind, bytes):
        return kind
    changed = dict(row)
    if kind == "unknown":
        changed["vintage"] = 1999
    elif kind == "target":
        changed["target"] = 1
    elif kind == "absent":
        del changed["cellar"]
    elif kind == "text in a number":
        changed["alcohol"] = "strong"
    elif kind == "bool in a number":
        changed["alcohol"] = True
    elif kind == "huge number":
        changed["magnesium"] = 1e300
    elif kind == "object in a category":
        changed["cellar"] = {"a": 1}
    elif kind == "short list":
        return [[1.0, 2.0, 3.0]]
    elif kind == "mixed":
        return [row, [1, 2]]
    return [changed]


@pytest.mark.slow
def test_bad_requests_are_400s_naming_the_problem(tmp_path):
    model, preprocessor, table, target = save_tiny_model(str(tmp_path / "wine"), steps=1)
    row = rows_of(table, target, [5])[0]
    server = Server(str(tmp_path / "wine"))
    try:
        answers = [server.request("POST", "/predict", _bad_body(kind, row))
                   for kind, _ in BAD_REQUESTS]
        # a missing value (null) and an unseen category are not errors; the server still works
        row_with_gaps = dict(row, alcohol=None, cellar="west")
        good = server.request("POST", "/predict", [row, row_with_gaps])
    finally:
        close_server(server)
    for (kind, message), (status, body) in zip(BAD_REQUESTS, answers):
        assert status == 400, (kind, body)
        assert message in body["error"], (kind, body)
    assert good[0] == 200, good
    np.testing.assert_allclose(
        good[1]["probabilities"][0],
        _softmax(in_process_scores(model, preprocessor, table))[5], atol=1e-6)
