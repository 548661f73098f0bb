"""``DynamicBatcher`` with real threads: a batch closes on size and on timeout, each caller gets
its own rows back, and a model's exception reaches every caller of its batch."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from neural_arch.core import no_grad
from neural_arch.data.tabular import load_bundled
from neural_arch.tabgpt.serving import BatchingWorker, DynamicBatcher, TabularPredictionService

import tabgpt_jobs as jobs

pytestmark = pytest.mark.timeout(30)


def _callers(worker, requests, timeout=10.0):
    """Each request submitted from a thread of its own, all at once; their answers."""
    answers, start = [None] * len(requests), threading.Barrier(len(requests))

    def call(i):
        start.wait(timeout=timeout)
        try:
            answers[i] = worker.predict(requests[i], timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - the test looks at what each caller got
            answers[i] = exc
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads)
    return answers


def test_the_polling_form_pads_to_the_longest_and_closes_on_size():
    batcher = DynamicBatcher(max_batch_size=4, timeout_ms=10_000, padding_strategy="longest")
    assert not batcher.add_request(np.ones((2, 3)))
    assert batcher.get_batch() is None  # neither full nor timed out
    assert batcher.add_request(np.full((2, 5), 2.0))  # 4 rows: full
    batch = batcher.get_batch()
    assert batch.data.shape == (4, 5) and batch.sizes == [2, 2]
    np.testing.assert_array_equal(batch.mask.sum(axis=1), [3, 3, 5, 5])
    np.testing.assert_array_equal(batch.data[:2, 3:], 0.0)
    # the next request would not fit beside the pending one: ready, and it waits for the next
    batcher.add_request(np.ones((3, 2)))
    assert batcher.add_request(np.ones((2, 2)))
    assert batcher.get_batch().sizes == [3] and batcher.pending_rows() == 2


def test_padding_to_max_length_and_refusals():
    batcher = DynamicBatcher(max_batch_size=8, timeout_ms=0, padding_strategy="max_length",
                             max_length=6)
    batcher.add_request(np.ones((1, 2)))
    assert batcher.get_batch().data.shape == (1, 6)
    with pytest.raises(ValueError, match="longer than max_length=6"):
        batcher.add_request(np.ones((1, 7)))
    with pytest.raises(ValueError, match="cannot fit a batch of max_batch_size=8"):
        batcher.add_request(np.ones((9, 2)))
    with pytest.raises(ValueError, match="padding_strategy must be one of"):
        DynamicBatcher(padding_strategy="shortest")


def test_a_batch_closes_on_size_and_each_caller_gets_its_own_rows():
    seen = []

    def model(batch):
        seen.append(list(batch.sizes))
        return batch.data.sum(axis=1) * np.where(batch.mask.any(axis=1), 1, -1)
    batcher = DynamicBatcher(max_batch_size=8, timeout_ms=5_000, padding_strategy="longest")
    with BatchingWorker(model, batcher) as worker:
        requests = [np.full((2, 1 + i), float(i)) for i in range(4)]  # 8 rows in all
        started = time.monotonic()
        answers = _callers(worker, requests)
        assert time.monotonic() - started < 4.0  # closed by size, not by the 5 s timeout
    for i, answer in enumerate(answers):
        np.testing.assert_array_equal(answer, np.full(2, float(i * (1 + i))))
    assert seen == [[2, 2, 2, 2]]


def test_a_batch_closes_on_timeout():
    batcher = DynamicBatcher(max_batch_size=64, timeout_ms=50, padding_strategy="longest")
    with BatchingWorker(lambda batch: batch.data[:, 0], batcher) as worker:
        started = time.monotonic()
        answer = worker.predict(np.array([[7.0]]), timeout=5.0)
        waited = time.monotonic() - started
    assert answer.tolist() == [7.0] and 0.04 <= waited < 2.0


def test_an_exception_in_the_model_reaches_every_caller_of_its_batch():
    def broken(batch):
        raise ArithmeticError(f"the model failed on {sum(batch.sizes)} rows")
    batcher = DynamicBatcher(max_batch_size=3, timeout_ms=5_000, padding_strategy="longest")
    with BatchingWorker(broken, batcher) as worker:
        answers = _callers(worker, [np.ones((1, 2)), np.ones((1, 3)), np.ones((1, 4))])
        assert worker.batches_run == 1
    assert all(isinstance(a, ArithmeticError) and "3 rows" in str(a) for a in answers)


def test_lengths_that_do_not_pad_fail_their_callers_only():
    batcher = DynamicBatcher(max_batch_size=2, timeout_ms=5_000, padding_strategy="do_not_pad")
    with BatchingWorker(lambda batch: batch.data[:, 0], batcher) as worker:
        answers = _callers(worker, [np.ones((1, 2)), np.ones((1, 3))])
        assert all(isinstance(a, ValueError) and "lengths" in str(a) for a in answers)
        assert worker.predict(np.ones((2, 2)), timeout=5.0).tolist() == [1.0, 1.0]


def test_the_prediction_service_answers_as_the_model_does_row_by_row():
    train, test, config = jobs.wine()
    model = jobs.tiny_classifier(config)
    table = {name: np.asarray(values)[:6] for name, values in load_bundled("wine")[0].items()}
    preprocessor = train.preprocessor
    encoded = preprocessor.transform(table)
    model.eval()
    with no_grad():
        expected = preprocessor.decode_target(
            model(encoded.x_num, encoded.x_cat).logits.numpy().argmax(axis=1))
    with TabularPredictionService(model, preprocessor, max_batch_size=6, timeout_ms=20) as service:
        requests = [{k: v[i:i + 2] for k, v in table.items()} for i in (0, 2, 4)]
        answers = _callers(service.worker, [
            np.concatenate([preprocessor.transform(r).x_num.astype(np.float64),
                            preprocessor.transform(r).x_cat.astype(np.float64)], axis=1)
            for r in requests])
        rows = [dict(zip(table, values)) for values in zip(*[v.tolist() for v in table.values()])]
        assert service.predict(rows[:3]) == list(expected[:3])
    assert [x for answer in answers for x in answer] == list(expected)
