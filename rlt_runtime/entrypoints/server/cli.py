"""rlt-serve: the OpenAI-compatible HTTP server.

    rlt-serve --model ouro-1.4b --port 8000
    RLT_API_KEY=secret rlt-serve --model ./Ouro-1.4B --max-num-seqs 128 --speculative-tokens 4

The HTTP port opens at once and answers /health with 503 while the model loads on the engine
thread; if loading fails the server exits with status 1. SIGINT/SIGTERM stop accepting, give
in-flight requests --shutdown-timeout seconds, then end the rest (streams with the error event
and [DONE]) and exit with status 0.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading
from typing import Mapping, Optional

from ...config import EngineConfig
from ...errors import ConfigError
from ..engine_args import add_engine_args, engine_kwargs
from .chat_template import load_chat_template
from .reasoning import REASONING_PARSERS
from .tools import TOOL_CALL_PARSERS

API_KEY_ENV = "RLT_API_KEY"
logger = logging.getLogger("rlt.server")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlt-serve",
                                description="Serve a looped language model over an OpenAI-compatible API.")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as `vllm serve MODEL` takes it (or give --model)")
    p.add_argument("--model", default=None, help="checkpoint directory, Hugging Face Hub name (e.g. ByteDance/Ouro-1.4B) or preset name (e.g. ouro-1.4b)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, nargs="+",
                   help="model id(s) clients may send, the first in responses (default: --model)")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("--api-key", default=None,
                      help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize (visible in ps: "
                      f"prefer --api-key-file or ${API_KEY_ENV})")
    keys.add_argument("--api-key-file", default=None,
                      help=f"read the API key from this file (surrounding whitespace dropped); default: ${API_KEY_ENV}")
    p.add_argument("--max-concurrent-requests", type=int, default=1024,
                   help="generation requests in flight before 429 (default 1024)")
    p.add_argument("--max-concurrent-sequences", type=int, default=4096,
                   help="engine sequences (prompts x n) in flight before 429 (default 4096)")
    p.add_argument("--max-prompts-per-request", type=int, default=128,
                   help="prompts in one completions request, else 400 (default 128)")
    p.add_argument("--max-sequences-per-request", type=int, default=1024,
                   help="prompts x n in one request, else 400 (default 1024)")
    p.add_argument("--max-json-depth", type=int, default=32,
                   help="deepest array/object nesting of a request body, else 400 (default 32)")
    p.add_argument("--prepare-threads", type=int, default=2,
                   help="threads that parse, validate and tokenize requests off the event loop (default 2)")
    p.add_argument("--max-pending-preparations", type=int, default=1024,
                   help="requests queued or running in preparation before 503 (default 1024)")
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
    p.add_argument("--responses-store-size", type=int, default=1024,
                   help="Responses API responses kept for previous_response_id and GET /v1/responses/{id}, the most "
                   "recent first (default 1024; 0: none)")
    p.add_argument("--responses-store-mib", type=int, default=256,
                   help="... and at most this many MiB of their JSON (default 256)")
    p.add_argument("--chat-template", default=None,
                   help="Jinja chat template (a file path, or the template inline) used instead of the checkpoint's own")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a chat_template in chat requests and /tokenize (else such a request is a 400)")
    p.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help="logprobs name every token as 'token_id:N' (a request can ask for it with "
                   "return_tokens_as_token_ids)")
    p.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSERS,
                   help="split <think>...</think> off chat answers into reasoning_content: think (the answer starts "
                   "in the reasoning when the prompt ends in an open <think>), deepseek_r1 (always starts in it) or "
                   "none (default: think when the chat template writes <think>, else none)")
    p.add_argument("--tool-call-parser", default=None, choices=TOOL_CALL_PARSERS,
                   help="read the tool calls a chat answer writes when tool_choice is 'auto' (the default with "
                   "tools): hermes (<tool_call>{...}</tool_call>), llama3_json ({...}; {...}), mistral "
                   "([TOOL_CALLS][{...}]) or pythonic ([f(a=1), g()]). Without it, 'auto' with tools is a 400; "
                   "'required' and a named function work either way")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="vLLM's switch for tool_choice 'auto': accepted with --tool-call-parser, which enables it")
    p.add_argument("--cors-origins", "--allowed-origins", nargs="*", default=[],
                   help="allowed CORS origins (default: no CORS; --allowed-origins is vLLM's name)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--uvicorn-log-level", default=None, choices=("debug", "info", "warning", "error", "critical",
                                                                 "trace"),
                   help="the HTTP server's (uvicorn's) log level (default: --log-level)")
    logs = p.add_mutually_exclusive_group()
    logs.add_argument("--enable-log-requests", action="store_true",
                      help="log each engine request: id, prompt, SamplingParams (vLLM's)")
    logs.add_argument("--disable-log-requests", action="store_true",
                      help="vLLM's; requests are not logged unless --enable-log-requests")
    p.add_argument("--max-log-len", type=int, default=None,
                   help="characters or token ids of a logged prompt (default: all)")
    p.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key (with --ssl-certfile)")
    p.add_argument("--ssl-certfile", default=None, help="the HTTPS certificate (with --ssl-keyfile)")
    p.add_argument("--ssl-ca-certs", default=None, help="a CA certificates file for HTTPS (uvicorn's ssl_ca_certs)")
    p.add_argument("--root-path", default=None, help="the path prefix a proxy serves the app under (ASGI root_path)")
    p.add_argument("--uds", default=None, help="listen on this Unix domain socket instead of --host/--port (vLLM's)")
    p.add_argument("--enable-request-id-headers", action="store_true",
                   help="every response carries X-Request-Id: the request's own, or a new one (vLLM's)")
    for flag in ("--disable-fastapi-docs", "--disable-frontend-multiprocessing"):
        p.add_argument(flag, action="store_true", help="vLLM's; no effect (rlt serves no docs pages, and runs its "
                                                       "front end in the server's process)")
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=False,
                   help="log every HTTP request (default off)")
    add_engine_args(p)
    return p


def api_key_from(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The API key: --api-key, else the contents of --api-key-file, else $RLT_API_KEY, else None."""
    if args.api_key is not None:
        return args.api_key
    if args.api_key_file is not None:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--api-key-file: cannot read {args.api_key_file!r}: {exc}") from None
        if not key:
            raise ConfigError(f"--api-key-file: {args.api_key_file!r} is empty")
        return key
    return environ.get(API_KEY_ENV) or None


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server local to this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def warn_if_exposed(host: str, api_key: Optional[str]) -> None:
    if api_key is None and not is_loopback(host):
        logger.warning("rlt-serve: binding %s without an API key: anyone who can reach this address can use the "
                       "server; set --api-key-file or $%s", host, API_KEY_ENV)


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, the model given as --model or positionally (as `vllm serve MODEL`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model is None and args.model_tag is None:
        parser.error("give the model: rlt-serve MODEL or --model MODEL")
    if args.model is not None and args.model_tag is not None and args.model != args.model_tag:
        parser.error(f"the model is given twice and differently: {args.model_tag!r} and --model {args.model!r}")
    args.model = args.model or args.model_tag
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ...engine.data_parallel import build_engine, replica_devices
    from ...engine.heap import freeze_heap
    from ...engine.disaggregated import role_devices
    from .app import ServerConfig, create_app
    from .http_server import build_server
    from .worker import EngineWorker

    try:
        options = engine_kwargs(args)
        engine_config = EngineConfig.from_kwargs(**options)
        engine_config.validate_static()  # option errors exit here, before the port opens
        if engine_config.role is not None:  # one engine of disaggregated prefill, served to a front end started apart
            from ...engine.remote_role import serve_role

            return serve_role(args.model, **options)
        if engine_config.distributed_executor == "ray":
            from ...engine.ray_replica import ray_replica_devices

            ray_replica_devices(engine_config)  # connects here, on the main thread, and checks the cluster's devices
        else:
            replica_devices(engine_config)
        if engine_config.disaggregated_prefill and engine_config.prefill_address is None:
            role_devices(engine_config)
        config = ServerConfig(
            served_model_name=args.served_model_name or args.model, api_key=api_key_from(args),
            max_concurrent_requests=args.max_concurrent_requests, max_body_bytes=args.max_body_bytes,
            request_timeout=args.request_timeout, shutdown_timeout=args.shutdown_timeout,
            cors_origins=tuple(args.cors_origins), max_concurrent_sequences=args.max_concurrent_sequences,
            max_prompts_per_request=args.max_prompts_per_request,
            max_sequences_per_request=args.max_sequences_per_request, max_json_depth=args.max_json_depth,
            prepare_threads=args.prepare_threads, max_pending_preparations=args.max_pending_preparations,
            keep_alive_timeout=args.keep_alive_timeout, header_timeout=args.header_timeout,
            body_timeout=args.body_timeout, max_connections=args.max_connections,
            chat_template=None if args.chat_template is None else load_chat_template(args.chat_template),
            reasoning_parser=args.reasoning_parser, tool_call_parser=args.tool_call_parser,
            trust_request_chat_template=args.trust_request_chat_template,
            responses_store_size=args.responses_store_size, responses_store_mib=args.responses_store_mib,
            return_tokens_as_token_ids=args.return_tokens_as_token_ids,
            log_requests=args.enable_log_requests, max_log_len=args.max_log_len,
            request_id_headers=args.enable_request_id_headers,
        )
        if (args.ssl_keyfile is None) != (args.ssl_certfile is None):
            raise ConfigError("--ssl-keyfile and --ssl-certfile go together: give both to serve HTTPS")
        if args.enable_auto_tool_choice and args.tool_call_parser is None:
            raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser (one of "
                              f"{', '.join(TOOL_CALL_PARSERS)})")
        config.validate()
    except ConfigError as exc:
        print(f"rlt-serve: error: {exc}", file=sys.stderr)
        return 2
    if args.uds is None:  # (a Unix socket is reachable through the file system only)
        warn_if_exposed(args.host, config.api_key)
    def start_engine():
        engine = build_engine(args.model, **options)
        freeze_heap()
        return engine

    worker = EngineWorker(start_engine)
    app = create_app(worker, config)
    server = build_server(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level or args.log_level,
                          access_log=args.access_log, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
                          ssl_ca_certs=args.ssl_ca_certs, root_path=args.root_path or "", uds=args.uds)

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
