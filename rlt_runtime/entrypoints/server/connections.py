"""Connection limits below the app: idle time, time to send a request head, open connections.

uvicorn's h11 protocol only times out a keep-alive connection after a response; a connection
that never sends a byte, or sends its request head one byte at a time, stays open for ever, and
every open connection holds a file descriptor. `bounded_protocol(...)` returns an H11Protocol
subclass that
  * closes a connection that sends nothing for `idle_timeout` s (also before its first request),
  * answers 408 and closes when a request head is not complete `header_timeout` s after its
    first byte,
  * answers 503 and closes at once when `max_connections` connections are already open.
`descriptor_budget()` derives the default cap and the listen backlog from the open-file limit.
The body deadline lives in the app (it can still answer 408 as JSON), see app.py `_Guard`.
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

FD_HEADROOM = 64  # descriptors kept free for the process itself (checkpoint files, logs, the device driver)
MAX_CONNECTIONS_CAP = 4096
MAX_BACKLOG = 2048


def descriptor_budget() -> tuple[int, int]:
    """(default max connections, listen backlog) from the soft RLIMIT_NOFILE.

    asyncio accepts up to `backlog` sockets per event-loop tick before any protocol sees them, so
    the cap is checked only after they hold descriptors: the budget leaves FD_HEADROOM plus two
    such batches free. backlog = soft / 8 (16..2048); cap = min(4096, soft - 64 - 2 * backlog).
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    backlog = max(16, min(MAX_BACKLOG, soft // 8))
    return max(1, min(MAX_CONNECTIONS_CAP, soft - FD_HEADROOM - 2 * backlog)), backlog


def _raw_response(status: int, reason: str, message: str, code: str, extra: str = "") -> bytes:
    """A complete HTTP/1.1 error response with the API's error body, for a connection about to close."""
    kind = "service_unavailable" if status == 503 else "timeout_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"{extra}connection: close\r\n\r\n")
    return head.encode("latin-1") + body


def bounded_protocol(idle_timeout: float, header_timeout: float, max_connections: int) -> type:
    """An H11Protocol class with these limits (pass it to uvicorn.Config(http=...))."""

    class BoundedH11Protocol(H11Protocol):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = idle_timeout
            self._head_timer: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.server_state.connections) >= max_connections:
                transport.write(_raw_response(
                    503, "Service Unavailable", f"the server is at its limit of {max_connections} open connections; "
                    "retry later", "too_many_connections", "retry-after: 1\r\n"))
                transport.close()
                return
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(idle_timeout, self.timeout_keep_alive_handler)

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self.transport is None:  # refused in connection_made
                return
            self._cancel_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and self.conn.their_state is h11.IDLE:
                self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request head is complete
                self._cancel_head_timer()

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            self.transport.write(_raw_response(
                408, "Request Timeout", f"the request head was not received within {header_timeout:g} s",
                "header_timeout"))
            self.transport.close()

    return BoundedH11Protocol
