"""The OpenAI-compatible FastAPI app: `create_app(engine_or_worker, config)`.

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models[/{id}], GET /health,
GET /metrics, POST /tokenize, POST /detokenize (see docs/serving.md). Handlers parse, validate and
tokenize on a bounded thread pool (the event loop keeps streaming meanwhile), count the request's
sequences (prompts x n) against the limits before tokenizing, then hand token ids to the
EngineWorker and await its outputs; nothing here waits for an engine step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional, Union

import anyio
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...beam_search import BeamSearch, BeamSearchParams, next_round, request_output, round_params, take_round
from ...engine.llm_engine import LLMEngine, eos_token_ids
from ...errors import ConfigError, RequestError
from ...executor.sleep import check_tags
from ...outputs import CompletionOutput, RequestOutput
from ...sampling_params import SamplingParams
from .metrics import CONTENT_TYPE
from .protocol import (
    ApiError, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta,
    ChatLogprobs, ChatMessageOut, CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
    DetokenizeRequest, DetokenizeResponse, ErrorResponse, ModelCard, ModelList, PromptLogprob, PromptLogprobs,
    PromptTokensDetails, TokenizeRequest, TokenizeResponse, TokenLogprobOut, TopLogprob, Usage, param_from_message, sse,
    template_messages,
    validation_error,
)
from .chat_template import check_chat_template
from .field_policy import apply_field_policy
from .json_body import parse_json_body
from .preparation import Preparer
from .reasoning import (REASONING_PARSERS, THINK_END, THINK_START, ReasoningSplitter, prompt_opens_reasoning,
                        template_mentions_thinking)
from .response_store import ResponseStore, StoredResponse, input_items_page
from .responses import ResponseObject, Responses, ResponsesRequest
from .tools import PARSERS, TOOL_CALL_PARSERS, RequiredCalls, call_id, split_calls
from .worker import EngineWorker, GenerationStream, WorkerUnavailable

PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/reset_prefix_cache", "/sleep", "/wake_up", "/is_sleeping",
                      "/start_profile", "/stop_profile", "/invocations")
ERROR_RESPONSES = {status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 503, 504)}
REQUEST_MODELS = (CompletionRequest, ChatCompletionRequest, ResponsesRequest, TokenizeRequest, DetokenizeRequest)
logger = logging.getLogger("rlt.server")


@dataclass
class ServerConfig:
    """HTTP-side limits and identity. The engine's own options live in EngineConfig."""

    # The model id(s) requests may name, the first in responses (vLLM's --served-model-name, which
    # takes several); default: the engine's model name.
    served_model_name: Optional[Union[str, list[str]]] = None
    api_key: Optional[str] = None  # required as "Authorization: Bearer <key>" on /v1/*, /tokenize, /detokenize
    max_concurrent_requests: int = 1024  # generation requests in flight; more get 429 + Retry-After
    max_concurrent_sequences: int = 4096  # engine sequences (prompts x n) in flight; more get 429 + Retry-After
    max_prompts_per_request: int = 128  # prompts in one completions request; more get 400
    max_sequences_per_request: int = 1024  # prompts x n in one request; more get 400
    max_json_depth: int = 32  # arrays/objects nested deeper in a body get 400 invalid_json
    prepare_threads: int = 2  # threads that parse, validate and tokenize requests off the event loop
    max_pending_preparations: int = 1024  # preparations queued or running; more get 503 + Retry-After
    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    request_timeout: float = 600.0  # seconds from arrival; later gets 504 (or an error event when streaming)
    shutdown_timeout: float = 30.0  # grace period for in-flight requests at shutdown
    cors_origins: tuple = ()  # no CORS headers unless origins are given ("*" allows any)
    keep_alive_timeout: float = 5.0  # a connection idle this long (before or between requests) is closed
    header_timeout: float = 10.0  # a request head not complete this long after its first byte: 408, closed
    body_timeout: float = 30.0  # a request body not complete this long after its head: 408, closed
    max_connections: Optional[int] = None  # open connections; more get 503 (default: from the descriptor limit)
    chat_template: Optional[str] = None  # a Jinja chat template used instead of the checkpoint's own
    trust_request_chat_template: bool = False  # requests may bring their own chat_template (else 400)
    return_tokens_as_token_ids: bool = False  # logprobs name tokens as "token_id:N" for every request
    log_requests: bool = False  # log each engine request: id, prompt (clipped to max_log_len), SamplingParams
    request_id_headers: bool = False  # every response carries X-Request-Id (the request's own, or a new one)
    max_log_len: Optional[int] = None  # characters or token ids of a logged prompt (None: all)
    responses_store_size: int = 1024  # stored responses (previous_response_id, GET /v1/responses/{id}); 0: none
    responses_store_mib: int = 256  # ... and at most this many MiB of their JSON
    reasoning_parser: Optional[str] = None  # think, deepseek_r1 or none; None: think if the template writes <think>
    tool_call_parser: Optional[str] = None  # one of TOOL_CALL_PARSERS: tool_choice "auto" reads the calls; None: 400

    def connection_limit(self) -> int:
        """max_connections, or when unset what the descriptor limit allows (connections.descriptor_budget)."""
        from .connections import descriptor_budget  # here: the app itself does not need uvicorn
        return self.max_connections if self.max_connections is not None else descriptor_budget()[0]

    def validate(self) -> None:
        for name in ("max_concurrent_requests", "max_body_bytes", "max_concurrent_sequences", "max_prompts_per_request",
                     "max_sequences_per_request", "max_json_depth", "prepare_threads", "max_pending_preparations"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("responses_store_size", "responses_store_mib"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer (0: no stored responses), got {value!r}")
        if self.max_connections is not None and (not isinstance(self.max_connections, int)
                                                 or isinstance(self.max_connections, bool) or self.max_connections < 1):
            raise ConfigError(f"max_connections must be a positive integer or None, got {self.max_connections!r}")
        for name in ("request_timeout", "shutdown_timeout", "keep_alive_timeout", "header_timeout", "body_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.max_sequences_per_request > self.max_concurrent_sequences:
            raise ConfigError(f"max_sequences_per_request ({self.max_sequences_per_request}) must not exceed "
                              f"max_concurrent_sequences ({self.max_concurrent_sequences})")
        if self.max_log_len is not None and (not isinstance(self.max_log_len, int) or isinstance(self.max_log_len, bool)
                                             or self.max_log_len < 0):
            raise ConfigError(f"max_log_len must be a non-negative integer or None, got {self.max_log_len!r}")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("api_key must be a non-empty string or None")
        names = self.served_model_name
        if names is not None and not (isinstance(names, str) and names or isinstance(names, (list, tuple)) and names
                                      and all(isinstance(n, str) and n for n in names)):
            raise ConfigError(f"served_model_name must be None, a non-empty string or a non-empty list of them, "
                              f"got {names!r}")
        if self.chat_template is not None:
            check_chat_template(self.chat_template)
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"reasoning_parser must be None (decided from the chat template) or one of "
                              f"{', '.join(repr(p) for p in REASONING_PARSERS)}, got {self.reasoning_parser!r}")
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ConfigError(f"tool_call_parser must be None or one of {', '.join(map(repr, TOOL_CALL_PARSERS))}, "
                              f"got {self.tool_call_parser!r}")


def create_app(engine_or_worker: Union[LLMEngine, EngineWorker, Callable[[], LLMEngine]],
               config: Optional[ServerConfig] = None) -> FastAPI:
    """The app. The worker's thread starts with the app's lifespan and stops at its end."""
    config = config or ServerConfig()
    config.validate()
    worker = engine_or_worker if isinstance(engine_or_worker, EngineWorker) else EngineWorker(engine_or_worker)
    serving = _Serving(worker, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        await asyncio.to_thread(worker.shutdown, config.shutdown_timeout)
        serving.preparer.shutdown()

    app = FastAPI(title="rlt OpenAI-compatible server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.worker = worker
    app.state.config = config
    app.state.serving = serving  # admission counters (inflight, inflight_sequences), for inspection

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        err = ApiError(exc.status_code, str(exc.detail), None, None)
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    # Bodies are parsed by the handlers (off the event loop), so each route declares its body schema.
    @app.post("/v1/completions", response_model=None, responses={200: {"model": CompletionResponse}, **ERROR_RESPONSES},
              openapi_extra=_json_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        return await serving.completions(request)

    @app.post("/v1/chat/completions", response_model=None,
              responses={200: {"model": ChatCompletionResponse}, **ERROR_RESPONSES},
              openapi_extra=_json_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        return await serving.chat(request)

    @app.post("/invocations", response_model=None, responses=ERROR_RESPONSES)
    async def invocations(request: Request) -> Response:
        """SageMaker's inference route, as vLLM routes it: a body with `messages` is a chat completion,
        one with `prompt` a completion (answered as those endpoints answer)."""
        body = await serving.parse(request, None)
        if isinstance(body, dict) and "messages" in body:
            return await serving.chat(request)
        if isinstance(body, dict) and "prompt" in body:
            return await serving.completions(request)
        raise ApiError(400, "an /invocations body needs 'messages' (a chat completion) or 'prompt' (a completion)",
                       None, "invalid_request")

    @app.post("/v1/responses", response_model=None, responses=ERROR_RESPONSES,
              openapi_extra=_json_body(ResponsesRequest))
    async def responses(request: Request) -> Response:
        return await serving.responses(request)

    @app.get("/v1/responses/{response_id}", response_model=None, responses=ERROR_RESPONSES)
    async def stored_response(response_id: str) -> JSONResponse:
        return JSONResponse(serving.stored(response_id).response)

    @app.delete("/v1/responses/{response_id}", response_model=None, responses=ERROR_RESPONSES)
    async def delete_response(response_id: str) -> JSONResponse:
        serving.stored(response_id)
        serving.stored_responses.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})

    @app.get("/v1/responses/{response_id}/input_items", response_model=None, responses=ERROR_RESPONSES)
    async def response_input_items(response_id: str, limit: int = 20, order: str = "desc",
                                   after: Optional[str] = None) -> JSONResponse:
        return JSONResponse(input_items_page(serving.stored(response_id).input_items, limit, order, after))

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def models() -> ModelList:
        return ModelList(data=serving.model_cards())

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERROR_RESPONSES)
    async def model(model_id: str) -> ModelCard:
        serving.check_model(model_id)
        return next(card for card in serving.model_cards() if card.id == model_id)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERROR_RESPONSES,
              openapi_extra=_json_body(TokenizeRequest))
    async def tokenize(request: Request) -> TokenizeResponse:
        body = await serving.parse(request, TokenizeRequest)
        return await serving.preparer.run(serving.tokenize, body)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERROR_RESPONSES,
              openapi_extra=_json_body(DetokenizeRequest))
    async def detokenize(request: Request) -> DetokenizeResponse:
        body = await serving.parse(request, DetokenizeRequest)
        return await serving.preparer.run(serving.detokenize, body)

    @app.post("/reset_prefix_cache", responses=ERROR_RESPONSES)
    async def reset_prefix_cache() -> JSONResponse:
        """vLLM's: forget every cached prompt prefix (e.g. after the weights changed)."""
        serving.engine()  # (503 while the engine is not ready)
        dropped = await asyncio.wrap_future(worker.call(lambda engine: engine.reset_prefix_cache()))
        return JSONResponse({"blocks_dropped": dropped})

    @app.post("/sleep", responses=ERROR_RESPONSES)
    async def sleep(request: Request) -> JSONResponse:
        """vLLM's: give back the device memory of the weights and the KV cache (`?level=1`: weights
        kept in host memory; `2`: discarded); generation requests get 503 until /wake_up. Needs
        --enable-sleep-mode and an idle engine."""
        serving.engine()
        text = request.query_params.get("level", "1")
        if text not in ("1", "2"):
            raise ApiError(400, f"level must be 1 or 2, got {text!r}", "level", "invalid_value")
        given = await serving.engine_call(worker.sleep(int(text)))
        return JSONResponse({"is_sleeping": True, "bytes_released": given})

    @app.post("/wake_up", responses=ERROR_RESPONSES)
    async def wake_up(request: Request) -> JSONResponse:
        """vLLM's: take back what /sleep gave (`?tags=weights&tags=kv_cache`; none: both)."""
        serving.engine()
        try:
            tags = check_tags(request.query_params.getlist("tags") or None)
        except ValueError as exc:
            raise ApiError(400, str(exc), "tags", "invalid_value") from None
        return JSONResponse({"is_sleeping": await serving.engine_call(worker.wake_up(tags))})

    @app.get("/is_sleeping", responses=ERROR_RESPONSES)
    async def is_sleeping() -> JSONResponse:
        serving.engine()
        return JSONResponse({"is_sleeping": worker.asleep})

    @app.post("/start_profile", responses=ERROR_RESPONSES)
    async def start_profile() -> JSONResponse:
        """vLLM's (`vllm bench serve --profile` calls it): a torch.profiler trace of the steps that
        follow; needs --profile-dir (400 otherwise, or while one records)."""
        serving.engine()
        await serving.engine_call(worker.call(lambda engine: engine.start_profile()))
        return JSONResponse({"profiling": True})

    @app.post("/stop_profile", responses=ERROR_RESPONSES)
    async def stop_profile() -> JSONResponse:
        """Stop the trace /start_profile began and write it into --profile-dir: the paths written."""
        serving.engine()
        traces = await serving.engine_call(worker.call(lambda engine: engine.stop_profile()))
        return JSONResponse({"profiling": False, "traces": traces})

    @app.get("/health", responses={503: {"model": ErrorResponse}})
    async def health() -> Response:
        if worker.ready:
            return JSONResponse({"status": "ok"})
        return JSONResponse(ApiError(503, worker.status, None, "not_ready").body(), status_code=503)

    for method in ("GET", "POST"):  # vLLM's (and SageMaker's) health check: /health
        app.add_api_route("/ping", health, methods=[method], operation_id=f"ping_{method.lower()}",
                          responses={503: {"model": ErrorResponse}})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": _package_version()})

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(worker.metrics.render(), media_type=CONTENT_TYPE)

    _declare_request_schemas(app, REQUEST_MODELS)
    app.add_middleware(_Guard, api_key=config.api_key, max_body_bytes=config.max_body_bytes,
                       body_timeout=config.body_timeout)
    if config.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["*"])
    if config.request_id_headers:  # outermost: every answer carries it, refusals included
        app.add_middleware(_RequestIdHeader)
    return app


def _package_version() -> str:
    """The installed rlt's version ("unknown" when run from a source tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlt")
    except PackageNotFoundError:
        return "unknown"


def _json_body(model: type[BaseModel]) -> dict:
    """OpenAPI `requestBody` of a route that parses `model` itself."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _declare_request_schemas(app: FastAPI, models: tuple) -> None:
    """Add the request models (and the models they use) to the app's OpenAPI components."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            components = generate().setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(schema.pop("$defs", {}))
                components[model.__name__] = schema
        return app.openapi_schema

    app.openapi = openapi


def _is_json(content_type: str) -> bool:
    """Whether a Content-Type header announces JSON (a missing header is read as JSON)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return not media or media == "application/json" or media.endswith("+json")


# ---- request handling --------------------------------------------------------------------------------

class _Serving:
    """Turns validated requests into engine requests and engine outputs into OpenAI responses."""

    def __init__(self, worker: EngineWorker, config: ServerConfig):
        self.worker = worker
        self.config = config
        self.created = int(time.time())
        self.inflight = 0  # generation requests holding a slot
        self.inflight_sequences = 0  # their engine sequences (prompts x n)
        self.preparer = Preparer(config.prepare_threads, config.max_pending_preparations)
        self._token_strs: dict[int, tuple[str, int]] = {}
        self._reasoning_parser: Optional[str] = None
        self.stored_responses = ResponseStore(config.responses_store_size, config.responses_store_mib << 20)

    # ---- identity and access ---------------------------------------------------------------------
    async def engine_call(self, future):
        """The result of an engine call on the worker's thread; its RequestError (a refused call,
        e.g. sleep mode off or requests in flight) is a 400 `invalid_request`."""
        try:
            return await asyncio.wrap_future(future)
        except RequestError as exc:
            raise ApiError(400, str(exc), None, "invalid_request") from None

    def engine(self) -> LLMEngine:
        if not self.worker.ready:
            raise ApiError(503, f"the engine is not ready ({self.worker.status})", None, "not_ready")
        return self.worker.engine

    def model_names(self) -> list[str]:
        """The ids requests may name; responses carry the first."""
        names = self.config.served_model_name or self.engine().model_name
        return [names] if isinstance(names, str) else list(names)

    def model_name(self) -> str:
        return self.model_names()[0]

    def model_cards(self) -> list[ModelCard]:
        engine = self.engine()
        return [ModelCard(id=name, created=self.created, root=engine.model_name, max_model_len=engine.max_model_len)
                for name in self.model_names()]

    def check_model(self, name: Optional[str]) -> None:
        """404 `model_not_found` unless `name` is a served id; no name (vLLM's rule) means the first."""
        if name is not None and name not in self.model_names():
            served = ", ".join(repr(n) for n in self.model_names())
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {served}",
                           "model", "model_not_found")

    def tokenizer(self, what: str):
        tok = self.engine().tokenizer
        if tok is None:
            raise ApiError(400, f"this model has no tokenizer: {what} is unavailable; send token ids", None,
                           "no_tokenizer")
        return tok

    def token_str(self, token_id: int) -> tuple[str, int]:
        """(the token as a string with special tokens spelled out, how many characters it adds to the text)."""
        entry = self._token_strs.get(token_id)
        if entry is None:
            tok = self.engine().tokenizer
            if tok is None:
                entry = (f"token_id:{token_id}", 0)
            else:
                entry = (tok.decode([token_id], skip_special_tokens=False), len(tok.decode([token_id])))
            self._token_strs[token_id] = entry
        return entry

    def reasoning_parser(self) -> str:
        """The reasoning parser chat answers go through: the configured one, else `think` when the chat
        template writes `<think>` markers and they survive detokenization, else `none`."""
        if self._reasoning_parser is None:
            tok = self.engine().tokenizer
            markers = THINK_START + THINK_END
            visible = tok is not None and tok.decode(tok.encode(markers, add_special_tokens=False)) == markers
            chosen = self.config.reasoning_parser
            if chosen is None:
                template = self.config.chat_template or (tok.chat_template if tok is not None else None)
                chosen = "think" if visible and template_mentions_thinking(template) else "none"
            elif chosen != "none" and not visible:
                logger.warning("reasoning parser %r: this tokenizer drops %s/%s from decoded text (special tokens), so "
                               "answers cannot be split and stay in content", chosen, THINK_START, THINK_END)
            self._reasoning_parser = chosen
        return self._reasoning_parser

    # ---- prompts ---------------------------------------------------------------------------------
    def prompt(self, prompt: Union[str, list[int]], params: SamplingParams, with_text: bool = False,
               add_special_tokens: bool = True) -> dict:
        """An engine prompt {"prompt_token_ids", "prompt"}, truncated as `params` ask
        (truncate_prompt_tokens), with its length checked against the context.

        Token-id prompts get their text (decoded) only `with_text` (echo needs it); a truncated
        text prompt's text is that of the tokens kept.
        """
        engine = self.engine()
        if isinstance(prompt, str):
            if not prompt:
                raise ApiError(400, "prompt must not be empty", "prompt")
            ids = self._encode(self.tokenizer("a text prompt"), prompt, "prompt", add_special_tokens=add_special_tokens)
            item = {"prompt_token_ids": ids, "prompt": prompt}
        else:
            ids = list(prompt)
            if not ids:
                raise ApiError(400, "prompt must not be empty", "prompt")
            vocab = engine.model_config.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ApiError(400, f"prompt token ids must be in [0, {vocab}); got {bad[:5]}", "prompt", "invalid_value")
            text = self.tokenizer("echo").decode(ids) if with_text else None
            item = {"prompt_token_ids": ids, "prompt": text}
        kept = params.truncated(ids, engine.max_model_len)
        if len(kept) < len(ids):
            text = self.tokenizer("a truncated prompt").decode(kept) if item["prompt"] is not None else None
            ids = item["prompt_token_ids"] = kept
            item["prompt"] = text
        if len(ids) >= engine.max_model_len:
            raise ApiError(400, f"the prompt has {len(ids)} tokens but the model's context is {engine.max_model_len} "
                           "tokens; the prompt must be shorter than the context", "prompt", "context_length_exceeded")
        return item

    def check_room(self, prompts: list[dict], max_tokens: Optional[int], field: str) -> None:
        if max_tokens is None:
            return
        limit = self.engine().max_model_len
        longest = max(len(p["prompt_token_ids"]) for p in prompts)
        if longest + max_tokens > limit:
            raise ApiError(400, f"{field} ({max_tokens}) plus the prompt ({longest} tokens) exceeds the model's context "
                           f"of {limit} tokens", field, "context_length_exceeded")

    def room(self, prompts: list[dict]) -> int:
        """Tokens the context leaves after the longest prompt."""
        return self.engine().max_model_len - max(len(p["prompt_token_ids"]) for p in prompts)

    @staticmethod
    def sampling_params(make: Callable):
        try:
            return make()
        except ConfigError as exc:
            raise ApiError(400, str(exc), param_from_message(str(exc)), "invalid_value") from None

    @staticmethod
    def with_trace_ids(params: SamplingParams, trace_ids: Optional[list[str]]) -> Union[SamplingParams, list]:
        """params, or with trace ids one SamplingParams per prompt (a single one for one prompt)."""
        if trace_ids is None:
            return params
        per_prompt = [dataclasses.replace(params, trace_id=t) for t in trace_ids]
        return per_prompt[0] if len(per_prompt) == 1 else per_prompt

    # ---- admission ---------------------------------------------------------------------------------
    async def parse(self, request: Request, model: Optional[type[BaseModel]]):
        """The validated request body (JSON parsing and validation run on the preparation pool); with
        no model, the parsed JSON itself."""
        content_type = request.headers.get("content-type", "")
        if not _is_json(content_type):
            raise ApiError(400, f"send the body as JSON with 'Content-Type: application/json' (got {content_type!r})",
                           None, "invalid_content_type")
        return await self.preparer.run(self._validate, await request.body(), model)

    def _validate(self, raw: bytes, model: type[BaseModel]):
        data = parse_json_body(raw, self.config.max_json_depth)
        if model is None:
            return data
        if model in (CompletionRequest, ChatCompletionRequest, ResponsesRequest):
            data = apply_field_policy(data, model.model_fields)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc.errors()) from None

    def count_sequences(self, num_prompts: int, n: int) -> int:
        """prompts x n, checked against the per-request caps (400 naming the field and the limit)."""
        cap = self.config.max_prompts_per_request
        if num_prompts > cap:
            raise ApiError(400, f"prompt has {num_prompts} prompts; at most {cap} are accepted per request "
                           "(--max-prompts-per-request)", "prompt", "too_many_prompts")
        cap = self.config.max_sequences_per_request
        if num_prompts * n > cap:
            raise ApiError(400, f"{num_prompts} prompts x n={n} make {num_prompts * n} sequences; at most {cap} are "
                           "accepted per request (--max-sequences-per-request)", "n", "too_many_sequences")
        return num_prompts * n

    def reserve(self, sequences: int) -> None:
        """Take a request slot and `sequences` sequence slots, or raise 429; `release` gives them back."""
        limit = self.config.max_concurrent_requests
        if self.inflight >= limit:
            raise ApiError(429, f"the server is at its limit of {limit} concurrent requests; retry later", None,
                           "too_many_requests", headers={"Retry-After": "1"})
        limit = self.config.max_concurrent_sequences
        if self.inflight_sequences + sequences > limit:
            raise ApiError(429, f"the server runs {self.inflight_sequences} of at most {limit} concurrent sequences "
                           f"and this request needs {sequences}; retry later", None, "too_many_requests",
                           headers={"Retry-After": "1"})
        self.inflight += 1
        self.inflight_sequences += sequences

    async def admit(self, request: Request, body, num_prompts: int, prepare: Callable, fmt: Callable,
                    arrival: float) -> Response:
        """Reserve the request's slots, run `prepare(body)` -> (prompts, params) on the pool, generate."""
        sequences = self.count_sequences(num_prompts, body.num_samples)
        self.reserve(sequences)
        try:
            prompts, params = await self.preparer.run(prepare, body)
        except BaseException:
            self.release(None, sequences)
            raise
        if isinstance(params, BeamSearchParams):
            return await self.beam_search(request, prompts, params, arrival, fmt(self, body, prompts), sequences)
        return await self.generate(request, prompts, params, arrival, body.stream, fmt(self, body, prompts), sequences)

    # ---- endpoints -------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        arrival = time.monotonic()
        body = await self.parse(request, CompletionRequest)
        self.check_model(body.model)
        body.check_neutral()
        if body.echo:
            self.tokenizer("echo")
        return await self.admit(request, body, len(body.prompts()), self._prepare_completion, _CompletionFormat,
                                arrival)

    def _prepare_completion(self, body: CompletionRequest) -> tuple[list[dict], object]:
        params = self.sampling_params(lambda: body.sampling_params(body.engine_max_tokens, body.logprobs,
                                                                   prompt_logprobs=body.engine_prompt_logprobs,
                                                                   defaults=self.engine().generation_defaults))
        prompts = [self.prompt(p, params, with_text=body.echo, add_special_tokens=body.add_special_tokens)
                   for p in body.prompts()]
        self.check_room(prompts, body.engine_max_tokens, "max_tokens")
        params = self.sampling_params(lambda: body.search_params(params, self.room(prompts)))
        return prompts, self.with_trace_ids(params, body.trace_ids(len(prompts)))

    async def _conversation(self, request: Request, model: type[BaseModel], what: str, prepare: Callable,
                            fmt: Callable) -> Response:
        """A request whose one prompt is a rendered conversation (chat completions, responses)."""
        arrival = time.monotonic()
        body = await self.parse(request, model)
        self.check_model(body.model)
        body.check_neutral()
        self.tokenizer(what)
        return await self.admit(request, body, 1, prepare, fmt, arrival)

    def _rendered_prompt(self, tok, text: str, field: str, params: SamplingParams,
                         add_special_tokens: bool = False) -> list[dict]:
        """The engine prompt of a rendered conversation `text`, the text kept (that of the tokens
        kept when params truncate it)."""
        ids = self._encode(tok, text, field, add_special_tokens=add_special_tokens)
        prompt = self.prompt(ids, params)
        prompt["prompt"] = text if len(prompt["prompt_token_ids"]) == len(ids) else tok.decode(prompt["prompt_token_ids"])
        return [prompt]

    async def chat(self, request: Request) -> Response:
        return await self._conversation(request, ChatCompletionRequest, "chat", self._prepare_chat, _ChatFormat)

    def _prepare_chat(self, body: ChatCompletionRequest) -> tuple[list[dict], object]:
        tok = self.tokenizer("chat")
        body.use_tool_parser(self.config.tool_call_parser)
        text = self._render(tok, body.template_messages(), body.add_generation_prompt, body.continue_final_message,
                            body.chat_template_kwargs, body.rendered_tools(), body.chat_template, body.documents)
        extra_stops = () if body.ignore_eos else tuple(tok.chat_stop_token_ids)
        params = self.sampling_params(lambda: body.sampling_params(body.output_limit, body.logprobs_count, extra_stops,
                                                                   defaults=self.engine().generation_defaults))
        prompts = self._rendered_prompt(tok, text, "messages", params, body.add_special_tokens)
        limit_field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
        self.check_room(prompts, body.output_limit, limit_field)
        params = self.conversation_params(body, params, text)
        params = self.sampling_params(lambda: body.search_params(params, self.room(prompts)))
        return prompts, self.with_trace_ids(params, body.trace_ids(len(prompts)))

    async def responses(self, request: Request) -> Response:
        return await self._conversation(request, ResponsesRequest, "responses", self._prepare_responses,
                                        _ResponsesFormat)

    def _prepare_responses(self, body: ResponsesRequest) -> tuple[list[dict], object]:
        tok = self.tokenizer("responses")
        body.use_tool_parser(self.config.tool_call_parser)
        earlier = None
        if body.previous_response_id is not None:
            earlier = self.stored_responses.conversation(body.previous_response_id)
            if earlier is None:
                raise ApiError(404, f"previous_response_id: no stored response {body.previous_response_id!r} (or one "
                               f"before it in its chain: the server keeps the {self.config.responses_store_size} most "
                               "recent, and none across restarts)", "previous_response_id",
                               "previous_response_not_found")
        text = self._render(tok, body.messages(earlier), True, False, None, body.rendered_tools())
        params = self.sampling_params(lambda: body.sampling_params(tuple(tok.chat_stop_token_ids),
                                                                   self.engine().generation_defaults))
        prompts = self._rendered_prompt(tok, text, "input", params)
        self.check_room(prompts, body.max_output_tokens, "max_output_tokens")
        return prompts, self.conversation_params(body, params, text)

    def conversation_params(self, body, params: SamplingParams, prompt: str) -> SamplingParams:
        """`params` of a conversation request whose rendered prompt is `prompt`. When the answer
        starts inside the reasoning, a structured-output constraint (or a tool choice's) starts
        after its end (`GuidedDecoding.after`), as vLLM applies it once the reasoning has ended.
        tool_choice "auto" keeps special tokens in the text (a model's call markers may be special
        tokens, and the parser must see them)."""
        parser = self.reasoning_parser()
        if params.guided is not None and parser != "none" and (parser == "deepseek_r1"
                                                               or prompt_opens_reasoning(prompt)):
            params = dataclasses.replace(params, guided=dataclasses.replace(params.guided, after=THINK_END))
        return dataclasses.replace(params, skip_special_tokens=False) if body.tool_call == "auto" else params

    def stored(self, response_id: str) -> StoredResponse:
        """The stored response `response_id` (404 naming it when it is not stored)."""
        entry = self.stored_responses.get(response_id)
        if entry is None:
            raise ApiError(404, f"no stored response {response_id!r} (responses are stored with store: true, the "
                           f"{self.config.responses_store_size} most recent, none across restarts)", "response_id",
                           "not_found")
        return entry

    def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        self.check_model(body.model)
        tok = self.tokenizer("/tokenize")
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give exactly one of prompt and messages", "prompt")
        if body.prompt is not None:
            ids = self._encode(tok, body.prompt, "prompt", add_special_tokens=body.add_special_tokens)
        else:
            text = self._render(tok, template_messages(body.messages), body.add_generation_prompt,
                                body.continue_final_message, body.chat_template_kwargs, body.rendered_tools(),
                                body.chat_template, body.documents)
            ids = self._encode(tok, text, "messages", add_special_tokens=False)
        return TokenizeResponse(count=len(ids), max_model_len=self.engine().max_model_len, tokens=ids)

    def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(body.model)
        tok = self.tokenizer("/detokenize")
        vocab = self.engine().model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"tokens must be in [0, {vocab}); got {bad[:5]}", "tokens", "invalid_value")
        return DetokenizeResponse(prompt=tok.decode(body.tokens, skip_special_tokens=False))

    @staticmethod
    def _encode(tok, text: str, field: str, add_special_tokens: bool = True) -> list[int]:
        try:
            return tok.encode(text, add_special_tokens=add_special_tokens)
        except RequestError as exc:  # e.g. a lone surrogate from a JSON "\ud800" escape
            raise ApiError(400, str(exc), field) from None

    def _render(self, tok, messages: list[dict], add_generation_prompt: bool, continue_final_message: bool,
                template_kwargs: Optional[dict], tools: Optional[list] = None, template: Optional[str] = None,
                documents: Optional[list] = None) -> str:
        """The chat prompt, through the request's `chat_template` (with --trust-request-chat-template),
        --chat-template or the checkpoint's template (transformers renders it)."""
        if template is not None:
            if not self.config.trust_request_chat_template:
                raise ApiError(400, "chat_template: this server does not accept chat templates from requests (start "
                               "rlt-serve with --trust-request-chat-template to allow them)", "chat_template",
                               "unsupported")
            try:
                check_chat_template(template)
            except ConfigError as exc:
                raise ApiError(400, str(exc), "chat_template", "invalid_value") from None
        try:
            return tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message,
                                           chat_template=template or self.config.chat_template,
                                           template_kwargs=template_kwargs, tools=tools, documents=documents)
        except RequestError as exc:
            raise ApiError(400, str(exc), param_from_message(str(exc)) or "messages") from None

    # ---- the generation lifecycle ----------------------------------------------------------------
    async def generate(self, request: Request, prompts: list[dict], params, arrival: float, streaming: bool,
                       fmt: "_Format", sequences: int) -> Response:
        """Run a request that holds its slots (see `reserve`); they are released when it ends."""
        stream: Optional[GenerationStream] = None
        handed_over = False
        try:
            stream = self.submit(prompts, params, arrival)
            error = await stream.admitted
            if error is not None:
                raise error
            if streaming:
                handed_over = True
                return _EventStream(fmt.events(stream), on_close=lambda: self.release(stream, sequences))
            await self.finish(request, stream)
            return Response(fmt.response(stream.outputs).model_dump_json(), media_type="application/json")
        finally:
            if not handed_over:
                self.release(stream, sequences)

    async def beam_search(self, request: Request, prompts: list[dict], params: BeamSearchParams, arrival: float,
                          fmt: "_Format", sequences: int) -> Response:
        """Run a use_beam_search request (beam_search.py): each round's one-token requests go to the
        engine as one submission, among the other requests; the request holds its slots until it ends."""
        engine = self.engine()
        eos = eos_token_ids(engine.tokenizer, engine.model_config)
        searches = [BeamSearch(p["prompt_token_ids"], params, eos, engine.max_model_len) for p in prompts]
        stream: Optional[GenerationStream] = None
        try:
            while True:
                rounds, batch = next_round(searches)
                if not batch:
                    break
                stream = self.submit([{"prompt_token_ids": ids, "prompt": None} for ids in batch],
                                     round_params(params), arrival)
                error = await stream.admitted
                if error is not None:
                    raise error
                await self.finish(request, stream)
                take_round(searches, rounds, stream.outputs)
            decode = engine.tokenizer.decode
            outputs = [request_output(s.result(decode), fmt.id, p["prompt"], p["prompt_token_ids"])
                       for s, p in zip(searches, prompts)]
            return Response(fmt.response(outputs).model_dump_json(), media_type="application/json")
        finally:
            self.release(stream, sequences)

    def submit(self, prompts: list[dict], params, arrival: float) -> GenerationStream:
        """Hand engine prompts to the engine thread, the request's deadline set (503 when the engine
        does not take requests)."""
        try:
            stream = self.worker.submit(prompts, params, arrival)
        except WorkerUnavailable as exc:
            raise ApiError(503, f"the engine is not accepting requests ({exc})", None, "not_ready") from None
        stream.set_deadline(max(self.config.request_timeout - (time.monotonic() - arrival), 0.0))
        if self.config.log_requests:
            for i, (request_id, prompt) in enumerate(zip(stream.request_ids, prompts)):
                shown = prompt.get("prompt") or prompt["prompt_token_ids"]
                if self.config.max_log_len is not None:
                    shown = shown[: self.config.max_log_len]
                logger.info("request %s: prompt %r, %d prompt tokens, %s", request_id, shown,
                            len(prompt["prompt_token_ids"]), params[i] if isinstance(params, list) else params)
        return stream

    async def finish(self, request: Request, stream: GenerationStream) -> None:
        """Wait for a submission's end (it is aborted if the client disconnects first)."""
        watcher = asyncio.ensure_future(_watch_disconnect(request, stream))
        try:
            await stream.wait_done()
        finally:
            watcher.cancel()

    def release(self, stream: Optional[GenerationStream], sequences: int) -> None:
        """End of an API request: free its slots and abort what is still running in the engine."""
        self.inflight -= 1
        self.inflight_sequences -= sequences
        if stream is None:
            return
        stream.cancel_deadline()
        if not stream.finished:
            self.worker.abort(stream)


async def _watch_disconnect(request: Request, stream: GenerationStream) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stream.fail(ApiError(499, "the client disconnected", None, "client_disconnected"))
            return


class _EventStream(StreamingResponse):
    """SSE response that stops as soon as the client disconnects, then runs `on_close`."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                async for chunk in self.body_iterator:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
        except OSError:  # the connection is gone
            pass
        finally:
            await self.body_iterator.aclose()
            self._on_close()


# ---- response formatting ---------------------------------------------------------------------------

def _finish(reason: Optional[str]) -> Optional[str]:
    return None if reason is None else ("length" if reason == "length" else "stop")


class _Progress:
    """What one choice has already streamed (`cursor`: into the stream's text, see text_since)."""

    __slots__ = ("cursor", "tokens", "offset", "finished", "splitter", "tool_text", "tool_sent", "required")

    def __init__(self, splitter: Optional[ReasoningSplitter] = None):
        self.cursor, self.tokens, self.offset, self.finished = 0, 0, 0, False
        self.splitter = splitter  # chat answers through a reasoning parser
        self.tool_text: Optional[str] = None  # a tool-choice answer's text so far (None: none streamed yet)
        self.tool_sent = 0  # characters of it streamed as content
        self.required = RequiredCalls()  # a "required" answer's calls as they are written


class _Format:
    """Shared streaming loop; subclasses shape choices, chunks and the final response."""

    prefix = "cmpl"

    def __init__(self, serving: _Serving, body, prompts: list[dict]):
        self.serving = serving
        self.body = body
        self.prompts = prompts
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = serving.model_name()
        self.tokens_as_ids = bool(getattr(body, "return_tokens_as_token_ids", None)
                                  or serving.config.return_tokens_as_token_ids)
        engine = serving.engine()
        turn_ends = engine.tokenizer.chat_stop_token_ids if engine.tokenizer is not None else ()
        self.eos = frozenset(eos_token_ids(engine.tokenizer, engine.model_config)) | frozenset(turn_ends)

    def stop_reason(self, c: CompletionOutput) -> Optional[Union[int, str]]:
        """vLLM's stop_reason of a finished sample: the stop string or stop token id that ended it
        (not an EOS or end-of-turn id: vLLM's models stop on those as EOS), or "repetition_detected";
        None otherwise."""
        if c.finish_reason != "stop" or c.stop_reason in self.eos:
            return None
        return c.stop_reason

    def token_str(self, token_id: int) -> tuple[str, int]:
        """`_Serving.token_str`, the token named "token_id:N" when the request or server asks for
        ids (return_tokens_as_token_ids); the width stays that of its text."""
        s, width = self.serving.token_str(token_id)
        return (f"token_id:{token_id}", width) if self.tokens_as_ids else (s, width)

    def shown(self, c: CompletionOutput) -> CompletionOutput:
        """What the response shows of an engine sample (all of it; echo-only completions drop it)."""
        return c

    def usage(self, outputs: list[RequestOutput]) -> Usage:
        prompt = sum(len(o.prompt_token_ids) for o in outputs)
        completion = sum(len(self.shown(c).token_ids) for o in outputs for c in o.outputs)
        cached = sum(o.metrics.num_cached_tokens for o in outputs if o.metrics is not None)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))

    def usage_so_far(self, progress: dict[int, _Progress]) -> Usage:
        """Usage of the tokens streamed so far (continuous_usage_stats)."""
        prompt = sum(len(p["prompt_token_ids"]) for p in self.prompts)
        completion = sum(st.tokens for st in progress.values())
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    async def events(self, stream: GenerationStream) -> AsyncIterator[bytes]:
        progress: dict[int, _Progress] = {}
        continuous = self.body.continuous_usage
        try:
            for chunk in self.opening():
                if continuous:
                    chunk.usage = self.usage_so_far(progress)
                yield sse(chunk)
            while True:
                for pi in await stream.changes():
                    out = stream.outputs[pi]
                    for c in out.outputs:
                        index = pi * self.body.n + c.index
                        st = progress.get(index)
                        if st is None:
                            st = progress[index] = self.start(pi)
                        chunk = self.delta(index, st, self.shown(c), out, self.reader(stream, pi))
                        if chunk is not None:
                            if continuous:
                                chunk.usage = self.usage_so_far(progress)
                            yield sse(chunk)
                if stream.finished:
                    break
            if self.body.include_usage:
                yield sse(self.usage_chunk(self.usage(stream.outputs)))
            yield sse("[DONE]")
        except ApiError as err:
            yield sse(err.body())
            yield sse("[DONE]")

    def opening(self) -> list:
        return []

    def token_ids(self, ids: list[int]) -> Optional[list[int]]:
        """`ids` where the request asked for token ids (return_token_ids), else None."""
        return list(ids) if self.body.return_token_ids else None

    def start(self, prompt_index: int) -> _Progress:
        """The stream state of a new choice of prompt `prompt_index`."""
        return _Progress()

    def reader(self, stream: GenerationStream, prompt_index: int) -> Callable[[int, int], tuple[str, int]]:
        """(sample index, cursor) -> (text after the cursor, next cursor) for one prompt's samples."""
        return lambda sample, cursor: stream.text_since(prompt_index, sample, cursor)

    def advance(self, st: _Progress, c: CompletionOutput, read: Callable[[int, int], tuple[str, int]]
                ) -> Optional[tuple[str, int, int, Optional[str]]]:
        """(new text, first new token, end token, finish reason) or None when nothing changed.
        O(new tokens and text): the text comes from `read` (a `reader`), not the whole text."""
        finish = _finish(c.finish_reason)
        if len(c.token_ids) == st.tokens and (finish is None or st.finished):
            return None
        text, st.cursor = read(c.index, st.cursor)
        first, end = st.tokens, len(c.token_ids)
        st.tokens, st.finished = end, finish is not None
        return text, first, end, finish


def _top_by_text(token_str: Callable, entries) -> dict[str, float]:
    """{token string: logprob} of (token id, logprob) pairs (strings from `token_str`, a format's);
    tokens spelled alike keep the larger value."""
    top: dict[str, float] = {}
    for t, v in entries:
        key = token_str(t)[0]
        top[key] = max(v, top.get(key, v))
    return top


def prompt_logprobs_out(serving: _Serving, out: RequestOutput) -> Optional[PromptLogprobs]:
    """vLLM's prompt_logprobs: per prompt token null (the first) or {token id: its entry} for the
    top N and the prompt token itself; ranks of the top N by position."""
    if out.prompt_logprobs is None:
        return None
    entries: PromptLogprobs = []
    for tid, lp in zip(out.prompt_token_ids, out.prompt_logprobs):
        if lp is None:
            entries.append(None)
            continue
        ranked = sorted(lp.top.items(), key=lambda kv: (-kv[1], kv[0]))
        d = {str(t): PromptLogprob(logprob=v, rank=r, decoded_token=serving.token_str(t)[0])
             for r, (t, v) in enumerate(ranked, 1)}
        d.setdefault(str(tid), PromptLogprob(logprob=lp.logprob, decoded_token=serving.token_str(tid)[0]))
        entries.append(d)
    return entries


class _CompletionFormat(_Format):
    def shown(self, c: CompletionOutput) -> CompletionOutput:
        if not self.body.echo_only:
            return c
        return dataclasses.replace(c, text="", token_ids=[], exit_depths=[], logprobs=None,
                                   finish_reason=None if c.finish_reason is None else "length")

    def logprobs(self, c: CompletionOutput, first: int, end: int, st: _Progress,
                 prompt: Optional[RequestOutput] = None) -> Optional[CompletionLogprobs]:
        """The choice's logprobs for tokens [first, end); with `prompt` (echo) the prompt's tokens first."""
        if self.body.logprobs is None:
            return None
        out = CompletionLogprobs()
        if prompt is not None:
            for tid, lp in zip(prompt.prompt_token_ids, prompt.prompt_logprobs or ()):
                s, width = self.token_str(tid)
                out.tokens.append(s)
                out.token_logprobs.append(None if lp is None else lp.logprob)
                out.top_logprobs.append(None if lp is None else _top_by_text(self.token_str, [*lp.top.items(),
                                                                                            (tid, lp.logprob)]))
                out.text_offset.append(st.offset)
                st.offset += width
            if self.body.echo_only:
                return out
        for tid, lp in zip(c.token_ids[first:end], (c.logprobs or ())[first:end]):
            s, width = self.token_str(tid)
            out.tokens.append(s)
            out.token_logprobs.append(lp.logprob)
            out.top_logprobs.append(_top_by_text(self.token_str, [*lp.top.items(), (tid, lp.logprob)]))
            out.text_offset.append(st.offset)
            st.offset += width
        return out

    def echo_text(self, prompt_index: int) -> str:
        return (self.prompts[prompt_index]["prompt"] or "") if self.body.echo else ""

    def reader(self, stream: GenerationStream, prompt_index: int) -> Callable[[int, int], tuple[str, int]]:
        if self.body.echo_only:  # the generated text is not shown
            return lambda sample, cursor: ("", cursor)
        return super().reader(stream, prompt_index)

    def delta(self, index: int, st: _Progress, c: CompletionOutput, out: RequestOutput,
              read: Callable[[int, int], tuple[str, int]]) -> Optional[CompletionResponse]:
        opening = st.tokens == 0 and not st.finished
        head = self.echo_text(index // self.body.n) if opening else ""
        step = self.advance(st, c, read)
        if step is None:
            return None
        text, first, end, finish = step
        echoed = out if opening and self.body.echo else None
        choice = CompletionChoice(index=index, text=head + text, logprobs=self.logprobs(c, first, end, st, echoed),
                                  prompt_logprobs=self.prompt_logprobs(out) if opening else None,
                                  finish_reason=finish, stop_reason=self.stop_reason(c) if finish else None,
                                  exit_depths=c.exit_depths[first:end],
                                  prompt_token_ids=self.token_ids(out.prompt_token_ids) if opening else None,
                                  token_ids=self.token_ids(c.token_ids[first:end]))
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[choice])

    def prompt_logprobs(self, out: RequestOutput) -> Optional[PromptLogprobs]:
        return prompt_logprobs_out(self.serving, out) if self.body.prompt_logprobs is not None else None

    def usage_chunk(self, usage: Usage) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)

    def response(self, outputs: list[RequestOutput]) -> CompletionResponse:
        choices = []
        for pi, out in enumerate(outputs):
            for c in map(self.shown, out.outputs):
                index = pi * self.body.n + c.index
                st = _Progress()
                choices.append(CompletionChoice(
                    index=index, text=self.echo_text(pi) + c.text,
                    logprobs=self.logprobs(c, 0, len(c.token_ids), st, out if self.body.echo else None),
                    prompt_logprobs=self.prompt_logprobs(out), finish_reason=_finish(c.finish_reason),
                    stop_reason=self.stop_reason(c), exit_depths=c.exit_depths, prompt_token_ids=self.token_ids(out.prompt_token_ids),
                    token_ids=self.token_ids(c.token_ids)))
        choices.sort(key=lambda ch: ch.index)
        return CompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices,
                                  usage=self.usage(outputs))


def _split_step(splitter: Optional[ReasoningSplitter], text: str, finished: bool) -> tuple[str, str]:
    """(reasoning, content) a step's new text settles (at the end, with the held-back rest)."""
    if splitter is None:
        return "", text
    reasoning, content = splitter.feed(text)
    if finished:
        rest = splitter.finish()
        reasoning, content = reasoning + rest[0], content + rest[1]
    return reasoning, content


class _ChatFormat(_Format):
    prefix = "chatcmpl"

    def __init__(self, serving: _Serving, body, prompts: list[dict]):
        super().__init__(serving, body, prompts)
        self.parser = serving.reasoning_parser()
        self.tool = getattr(body, "tool_call", None)  # None, "required", "auto" or the function a tool_choice names
        self.tool_parser = PARSERS.get(serving.config.tool_call_parser)  # reads an "auto" answer's calls

    def splitter(self) -> Optional[ReasoningSplitter]:
        return None if self.parser == "none" else ReasoningSplitter(self.parser, self.prompts[0]["prompt"])

    def start(self, prompt_index: int) -> _Progress:
        return _Progress(self.splitter())

    def logprobs(self, c: CompletionOutput, first: int, end: int) -> Optional[ChatLogprobs]:
        if self.body.logprobs_count is None or c.logprobs is None:
            return None
        content = []
        for tid, lp in zip(c.token_ids[first:end], c.logprobs[first:end]):
            top = [TopLogprob(token=self.token_str(t)[0], logprob=v, bytes=self._bytes(t))
                   for t, v in sorted(lp.top.items(), key=lambda kv: -kv[1])]
            content.append(TokenLogprobOut(token=self.token_str(tid)[0], logprob=lp.logprob,
                                           bytes=self._bytes(tid), top_logprobs=top))
        return ChatLogprobs(content=content)

    def _bytes(self, token_id: int) -> Optional[list[int]]:
        s = self.serving.token_str(token_id)[0]
        return None if "\ufffd" in s else list(s.encode("utf-8"))

    def chunk(self, choices: list[ChatChunkChoice], usage: Optional[Usage] = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices, usage=usage)

    def opening(self) -> list:
        chunks = [self.chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=self.body.echoed))])
                  for i in range(len(self.prompts) * self.body.n)]
        for chunk in chunks:
            chunk.prompt_token_ids = self.token_ids(self.prompts[0]["prompt_token_ids"])
        return chunks

    def delta(self, index: int, st: _Progress, c: CompletionOutput, out: RequestOutput,
              read: Callable[[int, int], tuple[str, int]]) -> Optional[ChatCompletionChunk]:
        step = self.advance(st, c, read)
        if step is None:
            return None
        text, first, end, finish = step
        reasoning, text = _split_step(st.splitter, text, finish is not None)
        if not self.body.include_reasoning:
            reasoning = ""
        delta = ChatDelta(content=text if text or not reasoning else None, reasoning_content=reasoning or None)
        if self.tool is not None:
            finish = self.tool_delta(st, delta, text, finish)
        return self.chunk([ChatChunkChoice(index=index, delta=delta, logprobs=self.logprobs(c, first, end),
                                           finish_reason=finish, stop_reason=self.stop_reason(c) if finish else None,
                                           exit_depths=c.exit_depths[first:end],
                                           token_ids=self.token_ids(c.token_ids[first:end]))])

    def tool_delta(self, st: _Progress, delta: ChatDelta, text: str, finish: Optional[str]) -> Optional[str]:
        """Turn a tool-choice answer's new `text` in `delta` into content and tool-call deltas;
        returns the finish reason. A named function's arguments stream as they come (its id and
        name with the first), and so do those of "required" calls (each call's id and name once its
        name is written); "auto" content streams up to where a call may begin, and its calls are
        sent whole when the answer ends (as content when they do not parse)."""
        opening = st.tool_text is None
        delta.content = self.streamed_content(st, text) or None
        if self.tool not in ("required", "auto"):
            if text or opening:
                head = {"id": call_id(), "type": "function", "function": {"name": self.tool, "arguments": text}}
                delta.tool_calls = [{"index": 0, **head}] if opening else [{"index": 0, "function": {"arguments": text}}]
            return finish
        if self.tool == "required":
            delta.tool_calls = st.required.feed(text) or None
            if finish is None:
                return None
            if not st.required.calls:  # no call begun (cut short): the text is the content
                delta.content = st.tool_text or None
                return finish
            return "tool_calls" if finish == "stop" else finish
        if finish is None:
            return None
        content, calls = split_calls(self.tool, st.tool_text, self.tool_parser)
        delta.content = content[st.tool_sent:] or None
        if calls is None:
            return finish
        delta.tool_calls = [{"index": i, **call} for i, call in enumerate(calls)]
        return "tool_calls" if finish == "stop" else finish

    def streamed_content(self, st: _Progress, text: str) -> str:
        """Of a tool-choice answer's new `text`, what streams as content now: for "auto" the text
        that cannot be part of a call (the parser's `streamable`), else nothing."""
        st.tool_text = (st.tool_text or "") + text
        if self.tool != "auto":
            return ""
        ready = max(self.tool_parser.streamable(st.tool_text), st.tool_sent)
        piece, st.tool_sent = st.tool_text[st.tool_sent:ready], ready
        return piece

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        return self.chunk([], usage)

    def message(self, text: str) -> ChatMessageOut:
        splitter = self.splitter()
        reasoning, content = (None, text) if splitter is None else splitter.split(text)
        if not self.body.include_reasoning:
            reasoning = None
        calls = None
        if self.tool is not None:
            content, calls = split_calls(self.tool, content, self.tool_parser)
        return ChatMessageOut(content=self.body.echoed + content, reasoning_content=reasoning, tool_calls=calls or [])

    def choice(self, c: CompletionOutput) -> ChatChoice:
        message = self.message(c.text)
        finish = _finish(c.finish_reason)
        if self.tool in ("required", "auto") and message.tool_calls and finish == "stop":
            finish = "tool_calls"  # vLLM's reason ("stop" after a named function's call)
        return ChatChoice(index=c.index, message=message, logprobs=self.logprobs(c, 0, len(c.token_ids)),
                          finish_reason=finish, stop_reason=self.stop_reason(c), exit_depths=c.exit_depths,
                          token_ids=self.token_ids(c.token_ids))

    def response(self, outputs: list[RequestOutput]) -> ChatCompletionResponse:
        choices = [self.choice(c) for c in outputs[0].outputs]
        choices.sort(key=lambda ch: ch.index)
        prompt_lps = prompt_logprobs_out(self.serving, outputs[0]) if self.body.prompt_logprobs is not None else None
        return ChatCompletionResponse(id=self.id, created=self.created, model=self.model, choices=choices,
                                      usage=self.usage(outputs), prompt_logprobs=prompt_lps,
                                      prompt_token_ids=self.token_ids(outputs[0].prompt_token_ids))


class _ResponsesFormat(_ChatFormat):
    """The Responses API's response object and its streamed events (responses.py); the answer is
    split into reasoning and content as a chat answer is."""

    prefix = "resp"

    def __init__(self, serving: _Serving, body, prompts: list[dict]):
        super().__init__(serving, body, prompts)
        self.build = Responses(body, self.model, stored=body.store is not False and serving.stored_responses.enabled)
        self.input_items = body.input_items()
        named = self.tool not in (None, "required", "auto")
        # A named function's call streams as its arguments come: its item, with the ids output() keeps.
        self.named_call = self.build.function_call_item(
            {"id": call_id(), "function": {"name": self.tool, "arguments": ""}}, "in_progress") if named else None

    def reasoning_tokens(self, c: CompletionOutput, reasoning: Optional[str]) -> int:
        """Output tokens up to the end of the reasoning: through the token that completes its end
        marker, or all of them when the answer ended inside it (none without reasoning)."""
        if reasoning is None:
            return 0
        decode = self.serving.engine().tokenizer.decode
        ids = c.token_ids
        if THINK_END not in decode(ids):
            return len(ids)
        lo, hi = 1, len(ids)
        while lo < hi:  # the shortest prefix whose text holds the marker
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if THINK_END in decode(ids[:mid]) else (mid + 1, hi)
        return lo

    def output(self, out: RequestOutput) -> tuple[list[dict], str, dict]:
        """(output items, status, usage) of the finished answer."""
        c = out.outputs[0]
        splitter = self.splitter()
        reasoning, content = (None, c.text) if splitter is None else splitter.split(c.text)
        status = "incomplete" if c.finish_reason == "length" else "completed"
        calls = None
        if self.tool is not None:
            content, calls = split_calls(self.tool, content, self.tool_parser)
        items = [self.build.reasoning_item(reasoning)] if reasoning else []  # (as streamed: no empty item)
        if content or not calls:  # (as streamed: no empty message item beside function calls)
            items.append(self.build.message_item(content, status))
        items += [self.build.function_call_item(call) for call in calls or []]
        if self.named_call is not None and calls:
            items[-1].update(id=self.named_call["id"], call_id=self.named_call["call_id"])
        usage = self.usage([out])
        return items, status, {
            "input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "input_tokens_details": {"cached_tokens": usage.prompt_tokens_details.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens(c, reasoning)}}

    def response(self, outputs: list[RequestOutput]) -> ResponseObject:
        return ResponseObject(**self.finished(*self.output(outputs[0])))

    def finished(self, items: list[dict], status: str, usage: dict) -> dict:
        """The finished response object, stored when the request asks (`store`)."""
        response = self.build.response(items, status, usage)
        if self.build.stored:
            self.serving.stored_responses.put(response, self.input_items)
        return response

    async def events(self, stream: GenerationStream) -> AsyncIterator[bytes]:
        b = self.build
        streaming = _StreamedItems(b)
        try:
            for kind in ("response.created", "response.in_progress"):
                yield sse(b.event(kind, response=b.response([], "in_progress", None)))
            st, read = self.start(0), self.reader(stream, 0)
            while True:
                await stream.changes()
                step = self.advance(st, stream.outputs[0].outputs[0], read)
                if step is not None:
                    reasoning, text = _split_step(st.splitter, step[0], step[3] is not None)
                    events = streaming.feed("reasoning", reasoning)
                    if self.named_call is not None:
                        events += streaming.feed_call(self.named_call, text) if text else []
                    elif self.tool == "required":
                        self.streamed_content(st, text)  # (keeps the text; a required answer streams none as content)
                        events += streaming.required_calls(st.required.feed(text))
                    else:
                        events += streaming.feed("message", self.streamed_content(st, text) if self.tool else text)
                    for event in events:
                        yield sse(event)
                if stream.finished:
                    break
            items, status, usage = self.output(stream.outputs[0])
            calls = [item for item in items if item["type"] == "function_call"]
            if self.named_call is not None:  # its arguments streamed already
                for event in streaming.feed_call(self.named_call, "") + streaming.finish_call(items[-1]):
                    yield sse(event)
                calls = []
            elif self.tool == "required" and streaming.calls:  # streamed already, as they were written
                events, done = streaming.end_required_calls()
                items = [item for item in items if item["type"] != "function_call"] + done
                for event in events:
                    yield sse(event)
                calls, message = [], False
            if self.tool is not None:  # the rest of an "auto" answer's text before its calls
                messages = [item for item in items if item["type"] == "message"]
                for event in streaming.feed("message", messages[0]["content"][0]["text"][st.tool_sent:]
                                            if messages else ""):
                    yield sse(event)
            message = not calls and self.named_call is None and not (self.tool == "required" and streaming.calls)
            for event in streaming.close(status, message=message) + streaming.function_calls(calls):
                yield sse(event)
            kind = "response.completed" if status == "completed" else "response.incomplete"
            yield sse(b.event(kind, response=self.finished(items, status, usage)))
        except ApiError as err:
            yield sse(b.event("error", code=err.code, message=err.message, param=err.param))


class _StreamedItems:
    """The output items of a streamed response as they open, grow and close (events of `Responses`):
    a reasoning item while the answer is in its reasoning, then the message item, a named
    function's call or a "required" answer's calls (their arguments growing); an "auto" answer's
    finished function calls come whole."""

    def __init__(self, build: Responses):
        self.build = build
        self.open: Optional[str] = None  # "reasoning" or "message": the item whose text streams now
        self.index = -1  # its output_index
        self.text = ""
        self.calls: list[dict] = []  # a "required" answer's function_call items, as they opened

    def _ids(self) -> dict:
        item_id = self.build.reasoning_id if self.open == "reasoning" else self.build.message_id
        return {"item_id": item_id, "output_index": self.index, "content_index": 0}

    def _part(self) -> dict:
        if self.open == "reasoning":
            return {"type": "reasoning_text", "text": self.text}
        return {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}

    def _start(self, kind: str) -> list:
        self.open, self.index, self.text = kind, self.index + 1, ""
        item = self.build.reasoning_item("", "in_progress") if kind == "reasoning" else \
            self.build.message_item(None, "in_progress")
        return [self.build.event("response.output_item.added", output_index=self.index, item=item),
                self.build.event("response.content_part.added", part=self._part(), **self._ids())]

    def _finish(self, status: str) -> list:
        reasoning = self.open == "reasoning"
        done = "response.reasoning_text.done" if reasoning else "response.output_text.done"
        extra = {} if reasoning else {"logprobs": []}
        item = self.build.reasoning_item(self.text) if reasoning else self.build.message_item(self.text, status)
        events = [self.build.event(done, text=self.text, **self._ids(), **extra),
                  self.build.event("response.content_part.done", part=self._part(), **self._ids()),
                  self.build.event("response.output_item.done", output_index=self.index, item=item)]
        self.open = None
        return events

    def _close_open(self) -> list:
        """Events that finish the item open now (the reasoning, before the next item opens), if any."""
        return self._finish("completed") if self.open is not None else []

    def feed(self, kind: str, piece: str) -> list:
        """Events that add `piece` to the item of `kind`, opening it (after closing the reasoning) first."""
        if not piece:
            return []
        events = []
        if self.open != kind:
            events = self._close_open() + self._start(kind)
        self.text += piece
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra = {} if kind == "reasoning" else {"logprobs": []}
        return events + [self.build.event(delta, delta=piece, **self._ids(), **extra)]

    def close(self, status: str, message: bool = True) -> list:
        """Events that finish the answer's items: the open one, and the message item (empty when no
        content streamed, unless not `message`) with the response's status."""
        events = self._finish("completed") if self.open == "reasoning" else []
        if self.open is None:
            if not message:
                return events
            events += self._start("message")
        return events + self._finish(status)

    def feed_call(self, item: dict, piece: str) -> list:
        """Events that add `piece` to the arguments of the streamed function_call `item`, opening
        it (after closing the reasoning) first."""
        events = []
        if self.open != "call":
            events = self._close_open()
            self.open, self.index, self.text = "call", self.index + 1, ""
            events.append(self.build.event("response.output_item.added", output_index=self.index, item=item))
        if piece:
            self.text += piece
            events.append(self.build.event("response.function_call_arguments.delta", delta=piece,
                                           item_id=item["id"], output_index=self.index))
        return events

    def finish_call(self, item: dict) -> list:
        """Events that end the streamed function_call, `item` as it finished."""
        self.open = None
        ids = {"item_id": item["id"], "output_index": self.index}
        return [self.build.event("response.function_call_arguments.done", arguments=item["arguments"], **ids),
                self.build.event("response.output_item.done", output_index=self.index, item=item)]

    def required_calls(self, deltas: list[dict]) -> list:
        """Events of a "required" answer's streamed calls (`RequiredCalls.feed` deltas): a call's
        item opens when its name is written (ending the one before), then its arguments grow."""
        events = []
        for delta in deltas:
            if "id" in delta:
                if self.calls:
                    events += self._end_call()
                self.calls.append(self.build.function_call_item(delta, "in_progress"))
            events += self.feed_call(self.calls[-1], delta["function"]["arguments"])
        return events

    def end_required_calls(self) -> tuple[list, list[dict]]:
        """(events that end the last streamed "required" call, every such call's finished item)."""
        return self._end_call(), list(self.calls)

    def _end_call(self) -> list:
        self.calls[-1] = dict(self.calls[-1], arguments=self.text, status="completed")
        return self.finish_call(self.calls[-1])

    def function_calls(self, items: list[dict]) -> list:
        """Events of finished function_call output items, each whole: added, its arguments, done."""
        events = []
        for item in items:
            events += self.feed_call(dict(item, arguments="", status="in_progress"), item["arguments"])
            events += self.finish_call(item)
        return events


# ---- ASGI guard: API key and body size --------------------------------------------------------------

class _RequestIdHeader:
    """vLLM's --enable-request-id-headers: every response carries X-Request-Id, the request's own
    (its X-Request-Id header, at most 128 characters) or a new one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = (_header(scope, b"x-request-id")[:128] or uuid.uuid4().hex).encode("latin-1")

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), (b"x-request-id", request_id)])
            await send(message)

        await self.app(scope, receive, send_with_id)


class _Guard:
    """Answers 401 (missing/wrong API key on protected paths; the scheme "Bearer" in any case), 413
    (body over the limit) and 408 (body not complete `body_timeout` s after the head; the connection
    closes) before the app reads anything; the body is read once here and replayed to the app."""

    def __init__(self, app, api_key: Optional[str], max_body_bytes: int, body_timeout: float):
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.api_key is not None and scope["method"] != "OPTIONS" and scope["path"].startswith(PROTECTED_PREFIXES):
            if not self._authorized(_header(scope, b"authorization")):
                await _send_error(send, ApiError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                                                 None, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"}))
                return
        declared = _header(scope, b"content-length")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_error(send, self._too_large())
            return
        chunks, size = [], 0
        deadline = time.monotonic() + self.body_timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                await _send_error(send, ApiError(
                    408, f"the request body was not received within {self.body_timeout:g} s", None, "body_timeout",
                    headers={"Connection": "close"}))
                return
            if message["type"] != "http.request":  # disconnected before the body arrived
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await _send_error(send, self._too_large())
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _authorized(self, header: str) -> bool:
        scheme, _, credentials = header.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode("latin-1"),
                                                                  self.api_key.encode())

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body exceeds the server's limit of {self.max_body_bytes} bytes", None,
                        "request_too_large")


def _header(scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""


async def _send_error(send, err: ApiError) -> None:
    response = JSONResponse(err.body(), status_code=err.status, headers=err.headers)
    await send({"type": "http.response.start", "status": response.status_code, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})
