"""`build_server(app, ...)`: the uvicorn server for an rlt app, with its connection limits and a
graceful shutdown that drains the engine before uvicorn closes connections.

uvicorn alone waits `timeout_graceful_shutdown` for responses and then cancels them (one
traceback per stream), and only afterwards runs the app's lifespan shutdown, where the engine
drains: streams were cut without the error event. Here shutdown runs in this order:
  1. stop accepting connections; idle connections close, busy ones close after their response;
  2. the worker stops admitting (new requests on open connections get 503) and running requests
     get `shutdown_timeout` s to finish;
  3. the worker fails what is still running: each stream ends with the error event and [DONE],
     each non-streaming request gets 503;
  4. responses get FLUSH_SECONDS to reach their clients, then connections still open (clients
     that stopped reading) are closed, and uvicorn's own shutdown finds nothing to cancel.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Optional

import uvicorn

from .connections import bounded_protocol, descriptor_budget

FLUSH_SECONDS = 2.0


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose shutdown drains the app's EngineWorker first (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, worker, shutdown_timeout: float):
        super().__init__(config)
        self.worker = worker
        self.shutdown_timeout = shutdown_timeout

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        if not self.force_exit:
            await asyncio.to_thread(self.worker.shutdown, self.shutdown_timeout)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + FLUSH_SECONDS
            while self.server_state.connections and loop.time() < deadline and not self.force_exit:
                await asyncio.sleep(0.02)
        for connection in list(self.server_state.connections):
            connection.transport.close()
        await super().shutdown(sockets)


def build_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
                 access_log: bool = False, ssl_keyfile: Optional[str] = None, ssl_certfile: Optional[str] = None,
                 ssl_ca_certs: Optional[str] = None, root_path: str = "", uds: Optional[str] = None) -> DrainingServer:
    """The server for `app` (from create_app): limits from app.state.config, draining app.state.worker;
    HTTPS with ssl_keyfile and ssl_certfile (and ssl_ca_certs, uvicorn's); root_path: the prefix a
    proxy serves the app under; uds: a Unix domain socket path to listen on instead of host:port."""
    config = app.state.config
    uv_config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log, log_config=None, lifespan="on",
        ssl_keyfile=ssl_keyfile, ssl_certfile=ssl_certfile, ssl_ca_certs=ssl_ca_certs, root_path=root_path, uds=uds,
        http=bounded_protocol(config.keep_alive_timeout, config.header_timeout, config.connection_limit()),
        timeout_keep_alive=config.keep_alive_timeout, timeout_graceful_shutdown=FLUSH_SECONDS,
        backlog=descriptor_budget()[1],
    )
    return DrainingServer(uv_config, app.state.worker, config.shutdown_timeout)
