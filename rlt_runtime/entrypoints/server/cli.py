"""rlt-serve: the OpenAI-compatible HTTP server.

    rlt-serve --model ouro-1.4b --port 8000
    rlt-serve --model ./Ouro-1.4B --api-key secret --max-num-seqs 128 --speculative-tokens 4

The HTTP port opens at once and answers /health with 503 while the model loads on the engine
thread; if loading fails the server exits with status 1. SIGINT/SIGTERM stop accepting, give
in-flight requests --shutdown-timeout seconds, then end the rest (streams with the error event
and [DONE]) and exit with status 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ...config import EngineConfig
from ...errors import ConfigError
from ..engine_args import add_engine_args, engine_kwargs



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlt-serve",
                                description="Serve a looped language model over an OpenAI-compatible API.")
    p.add_argument("--model", required=True, help="checkpoint directory or preset name (e.g. ouro-1.4b)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="model id clients send (default: --model)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize")
    p.add_argument("--max-concurrent-requests", type=int, default=1024,
                   help="generation requests in flight before 429 (default 1024)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="request body limit, else 413 (default 1 MiB)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request, else 504 (default 600)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get at shutdown before they are aborted (default 30)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0,
                   help="seconds a connection may sit idle, before its first request or between requests (default 5)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds from a request's first byte to the end of its head, else 408 and close (default 10)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds from the end of a request head to the end of its body, else 408, closed (default 30)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections; more get 503 and are closed (default: from the open-file limit, see docs)")
    p.add_argument("--cors-origins", nargs="*", default=[], help="allowed CORS origins (default: no CORS)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=False,
                   help="log every HTTP request (default off)")
    add_engine_args(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ...engine.llm_engine import LLMEngine
    from .app import ServerConfig, create_app
    from .http_server import build_server
    from .worker import EngineWorker

    try:
        options = engine_kwargs(args)
        EngineConfig.from_kwargs(**options).validate_static()  # option errors exit here, before the port opens
        config = ServerConfig(
            served_model_name=args.served_model_name or args.model, api_key=args.api_key,
            max_concurrent_requests=args.max_concurrent_requests, max_body_bytes=args.max_body_bytes,
            request_timeout=args.request_timeout, shutdown_timeout=args.shutdown_timeout,
            cors_origins=tuple(args.cors_origins), keep_alive_timeout=args.keep_alive_timeout,
            header_timeout=args.header_timeout, body_timeout=args.body_timeout, max_connections=args.max_connections,
        )
        config.validate()
    except ConfigError as exc:
        print(f"rlt-serve: error: {exc}", file=sys.stderr)
        return 2
    worker = EngineWorker(lambda: LLMEngine(args.model, **options))
    app = create_app(worker, config)
    server = build_server(app, host=args.host, port=args.port, log_level=args.log_level, access_log=args.access_log)

    def stop_if_load_fails() -> None:
        worker.start()
        worker.wait_ready()
        if worker.failure is not None:
            server.should_exit = True

    threading.Thread(target=stop_if_load_fails, name="rlt-serve-load", daemon=True).start()
    # uvicorn handles SIGTERM while it runs and re-raises it after its shutdown; this handler then
    # takes it, so a SIGTERM shutdown exits with status 0 instead of dying by the signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: setattr(server, "should_exit", True))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the signal after its graceful shutdown
        pass
    if worker.failure is not None:
        print(f"rlt-serve: error: the engine failed: {worker.failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
