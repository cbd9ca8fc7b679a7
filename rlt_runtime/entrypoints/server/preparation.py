"""A bounded thread pool for request preparation (JSON parsing, validation, tokenization).

Preparation can take long for large bodies; running it off the asyncio loop keeps every
running stream flowing meanwhile. At most `max_pending` jobs wait or run at once; the next one
is answered 503 `overloaded` with `Retry-After: 1`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from .protocol import ApiError

T = TypeVar("T")


class Preparer:
    """`await run(fn, *args)` runs fn on one of `threads` worker threads. Use from one event loop."""

    def __init__(self, threads: int, max_pending: int):
        self.max_pending = max_pending
        self.pending = 0  # jobs queued or running; only touched on the event loop
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rlt-prepare")

    async def run(self, fn: Callable[..., T], *args) -> T:
        if self.pending >= self.max_pending:
            raise ApiError(503, f"the server already prepares {self.max_pending} requests (parsing, tokenization); "
                           "retry later", None, "overloaded", headers={"Retry-After": "1"})
        try:
            job = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except RuntimeError:  # the pool was shut down: the server is stopping
            raise ApiError(503, "the server is shutting down", None, "shutting_down") from None
        self.pending += 1
        try:
            return await job
        finally:
            self.pending -= 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
