"""How the batching thread hands results to the HTTP loop: a batch's requests complete one after
another on that thread, and each loop wake-up costs it a write to the loop's self-pipe and the
interpreter lock handed to the loop and back; the results of one batch wake the loop once, and
each request still gets its own result (or exception), cancelling a waiter leaves the batching
thread's future alone."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from neural_arch.serve.app import _awaitable  # noqa: E402

pytestmark = pytest.mark.timeout(10)


def test_a_batchs_results_wake_the_loop_once_and_reach_their_own_requests():
    async def scenario():
        loop = asyncio.get_running_loop()
        wakes = []
        original = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            wakes.append(callback)
            return original(callback, *args, **kwargs)
        loop.call_soon_threadsafe = counting
        futures = [Future() for _ in range(8)]
        waiters = [_awaitable(future) for future in futures]
        cancelled = _awaitable(futures[0])
        cancelled.cancel()  # a client gone: its future still gets its result below

        def batching_thread():  # one batch: every result set in a row
            for i, future in enumerate(futures[:-1]):
                future.set_result(i * 10)
            futures[-1].set_exception(ArithmeticError("row 7 failed"))
        # the loop is held (as when it is busy with other requests) while the batch completes
        thread = threading.Thread(target=batching_thread)
        thread.start()
        thread.join(timeout=5)
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True),
                                         timeout=5)
        return wakes, results, futures
    wakes, results, futures = asyncio.run(scenario())
    assert results[:7] == [0, 10, 20, 30, 40, 50, 60]
    assert isinstance(results[7], ArithmeticError) and "row 7" in str(results[7])
    assert futures[0].result() == 0 and not futures[0].cancelled()
    assert len(wakes) == 1, f"{len(wakes)} loop wake-ups for one batch of 8 results"
