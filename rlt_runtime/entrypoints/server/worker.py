"""EngineWorker: the one thread that owns the engine; HTTP handlers talk to it through queues.

The engine is synchronous and not thread-safe, so exactly one thread calls `add_request`,
`step` and `abort_request`. Handlers on the asyncio loop send commands into a thread-safe
inbox (`submit`, `abort`, `call`); the owner thread applies them between steps and hands each
step's outputs back to the loop in one `call_soon_threadsafe` batch. The HTTP loop never
waits for a step.

A `GenerationStream` is the loop-side view of one API request (one engine request per
prompt). The engine hands out delta outputs (only what each step added), so the owner thread's
work per step does not grow with how long requests have run; the stream merges them in place
into one cumulative output per prompt (`OutputAccumulator`), and readers keep cursors into it: a
slow client reads fewer, larger deltas and never makes the server buffer more than the output.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from typing import Callable, Optional, Union

from ...engine.data_parallel import DataParallelEngine
from ...engine.disaggregated import DisaggregatedEngine
from ...engine.llm_engine import LLMEngine
from ...errors import ConfigError, RequestError, RltError
from ...outputs import OutputAccumulator, RequestOutput
from ...sampling_params import SamplingParams
from .metrics import RequestTimer, ServerMetrics
from .protocol import ApiError, param_from_message

logger = logging.getLogger("rlt.server")

_STOP = object()


ASLEEP = "the engine is asleep (sleep mode): POST /wake_up to wake it"


class WorkerUnavailable(RuntimeError):
    """The worker is not accepting requests (loading, failed or shutting down)."""


class GenerationStream:
    """Outputs of one API request's engine requests, merged from their deltas; lives on the asyncio loop.

    `outputs[i]` is prompt i's cumulative RequestOutput (None before its first delta; its lists
    grow in place, each sample's text is filled in when the prompt finishes; `text_since` reads
    the text before that). `admitted` resolves to None once every prompt is queued in the engine,
    or to the ApiError that rejected one of them (then none of them run). `changes()` waits for
    new outputs.
    `error` is set when the request failed after admission (timeout, shutdown, engine failure).
    """

    def __init__(self, request_ids: list[str], loop: asyncio.AbstractEventLoop):
        self.request_ids = request_ids
        self.loop = loop
        self.admitted: asyncio.Future = loop.create_future()
        self._merged = [OutputAccumulator() for _ in request_ids]
        self.error: Optional[ApiError] = None
        self._fresh = [False] * len(request_ids)
        self._changed = asyncio.Event()
        self._done = asyncio.Event()
        self._timer: Optional[asyncio.TimerHandle] = None

    @property
    def outputs(self) -> list[Optional[RequestOutput]]:
        return [m.output for m in self._merged]

    @property
    def finished(self) -> bool:
        return all(m.finished for m in self._merged)

    def text_since(self, prompt_index: int, sample_index: int, cursor: int) -> tuple[str, int]:
        """Text a sample of prompt `prompt_index` added after `cursor` (0 at first), and the next cursor."""
        return self._merged[prompt_index].text_since(sample_index, cursor)

    def set_deadline(self, seconds: float) -> None:
        """Fail with 504 if not finished within `seconds` from now."""
        self._timer = self.loop.call_later(seconds, self.fail, ApiError(
            504, f"the request did not finish within the server's request timeout ({seconds:g} s)", None, "timeout"))

    def cancel_deadline(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def changes(self) -> list[int]:
        """Wait until some prompt has a new output; returns those prompt indices. Raises `error`."""
        await self._changed.wait()
        self._changed.clear()
        if self.error is not None:
            raise self.error
        fresh = [i for i, f in enumerate(self._fresh) if f]
        self._fresh = [False] * len(self._fresh)
        return fresh

    async def wait_done(self) -> None:
        """Wait until every prompt finished or the stream failed; raises `error`."""
        await self._done.wait()
        if self.error is not None:
            raise self.error

    # ---- called on the loop by the worker ----------------------------------------------------------
    def _admit(self, error: Optional[ApiError]) -> None:
        if not self.admitted.done():
            self.admitted.set_result(error)

    def _deliver(self, index: int, delta: RequestOutput) -> None:
        self._merged[index].add(delta)
        self._fresh[index] = True
        self._changed.set()
        if self.finished:
            self.cancel_deadline()
            self._done.set()

    def fail(self, error: ApiError) -> None:
        """Fail the stream (first error wins; no effect once finished)."""
        if self.error is not None or self.finished:
            return
        self.error = error
        self._admit(error)
        self.cancel_deadline()
        self._changed.set()
        self._done.set()


class _Active:
    __slots__ = ("stream", "index", "timer")

    def __init__(self, stream: GenerationStream, index: int, timer: RequestTimer):
        self.stream, self.index, self.timer = stream, index, timer


class EngineWorker:
    """Runs an LLMEngine (or a DataParallelEngine or DisaggregatedEngine: the same surface) on its own thread.

    engine: an engine, or a zero-argument callable that builds one on the owner thread (the
    server then answers /health with 503 while the model loads).

    An output with `error` set (a data-parallel replica failed under it) fails its stream with a
    500, as an engine failure does; the other requests go on.
    """

    def __init__(self, engine: Union[LLMEngine, DataParallelEngine, Callable[[], LLMEngine]], metrics: Optional[ServerMetrics] = None,
                 stats_interval: float = 0.05):
        self._source = engine
        self.metrics = metrics or ServerMetrics()
        self.stats_interval = stats_interval
        self._engine: Optional[LLMEngine] = None
        self._inbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._active: dict[str, _Active] = {}
        self._streams: dict[GenerationStream, int] = {}  # stream -> engine requests still running
        self._posts: dict[asyncio.AbstractEventLoop, list] = {}
        self._ready = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._start_lock = threading.Lock()
        self._closing = False
        self.failure: Optional[BaseException] = None
        self._last_stats = 0.0
        self.asleep = False  # sleep mode: the engine gave its memory back; new requests get 503 until it wakes

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> "EngineWorker":
        """Start the owner thread (idempotent)."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rlt-engine", daemon=True)
                self._thread.start()
        return self

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Block until the engine is built (or failed); True when it is serving."""
        self._ready.wait(timeout)
        return self.ready

    @property
    def ready(self) -> bool:
        return (self._ready.is_set() and self.failure is None and not self._closing
                and self._thread is not None and self._thread.is_alive())

    @property
    def status(self) -> str:
        if self.failure is not None:
            return f"engine failed: {self.failure}"
        if self._closing:
            return "shutting down"
        if not self._ready.is_set():
            return "loading the model"
        return "ready" if self.ready else "stopped"

    @property
    def engine(self) -> LLMEngine:
        if self._engine is None:
            raise WorkerUnavailable(self.status)
        return self._engine

    @property
    def num_active(self) -> int:
        """API requests still running in the engine."""
        return len(self._streams)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop accepting, let running requests finish for up to `timeout` s, abort the rest, stop.

        Blocking; returns within about `timeout` s plus one engine step.
        """
        self._closing = True
        if self._thread is None:
            return
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)
        self._inbox.put(_STOP)
        self._thread.join(max(deadline - time.monotonic(), 0.0) + 10.0)

    # ---- commands (any thread; submit/abort from the stream's event loop) ---------------------------
    def submit(self, prompts: list, params: Union[SamplingParams, list[SamplingParams]],
               arrival_time: float) -> GenerationStream:
        """Queue one engine request per prompt (each a token-id list or {"prompt_token_ids", "prompt"});
        params: one SamplingParams for all prompts or one per prompt."""
        if not self.ready or self.asleep:
            raise WorkerUnavailable(ASLEEP if self.ready else self.status)
        base = uuid.uuid4().hex
        ids = [base] if len(prompts) == 1 else [f"{base}-{i}" for i in range(len(prompts))]
        stream = GenerationStream(ids, asyncio.get_running_loop())
        self._inbox.put(("add", stream, prompts, params, arrival_time))
        return stream

    def abort(self, stream: GenerationStream) -> None:
        """Abort every unfinished engine request of `stream`; their KV blocks are freed at once."""
        self._inbox.put(("abort", stream))

    def call(self, fn: Callable[[LLMEngine], object]) -> concurrent.futures.Future:
        """Run fn(engine) on the owner thread between steps (inspection, tests)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, fut))
        return fut

    def sleep(self, level: int) -> concurrent.futures.Future:
        """`engine.sleep(level)` on the owner thread (the bytes given back); requests are then refused."""
        def run(engine):
            given = engine.sleep(level)
            self.asleep = True
            return given
        return self.call(run)

    def wake_up(self, tags: Optional[list[str]]) -> concurrent.futures.Future:
        """`engine.wake_up(tags)` on the owner thread; requests are taken again once nothing is asleep."""
        def run(engine):
            engine.wake_up(tags)
            self.asleep = engine.is_sleeping()
            return self.asleep
        return self.call(run)

    # ---- owner thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            built = isinstance(self._source, (LLMEngine, DataParallelEngine, DisaggregatedEngine))
            engine = self._source if built else self._source()
            self.metrics.set_depth(engine.depth)
            self.metrics.update_engine(engine.stats())
            self._engine = engine
        except RltError as exc:  # a bad model or option: the message says it all
            logger.error("rlt-serve: the engine failed to load: %s", exc)
            self.failure = exc
            self._ready.set()
            return
        except BaseException as exc:  # noqa: BLE001 - reported through /health and the CLI
            logger.exception("rlt-serve: the engine failed to load")
            self.failure = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(engine)
        except BaseException as exc:  # noqa: BLE001 - an engine bug: fail every request, keep the process up
            logger.exception("rlt-serve: the engine step failed; the server stops serving")
            self.failure = exc
        finally:
            self._stop_all(engine)
            if isinstance(engine, (DataParallelEngine, DisaggregatedEngine)):
                engine.shutdown()

    def _loop(self, engine: LLMEngine) -> None:
        while True:
            busy = engine.has_unfinished_requests()
            for cmd in self._commands(block=not busy):
                if cmd is _STOP:
                    return
                self._apply(engine, cmd)
            if engine.has_unfinished_requests():
                outs = engine.step(deltas=True)
                now = time.monotonic()
                for out in outs:
                    self._publish(out, now)
            self._flush()
            now = time.monotonic()
            if now - self._last_stats >= self.stats_interval or not engine.has_unfinished_requests():
                self._last_stats = now
                self.metrics.update_engine(engine.stats())

    def _commands(self, block: bool) -> list:
        cmds = []
        if block:
            try:
                cmds.append(self._inbox.get(timeout=1.0))
            except queue.Empty:
                return cmds
        while True:
            try:
                cmds.append(self._inbox.get_nowait())
            except queue.Empty:
                return cmds

    def _apply(self, engine: LLMEngine, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            self._add(engine, *cmd[1:])
        elif kind == "abort":
            self._abort(engine, cmd[1])
        elif kind == "call":
            fn, fut = cmd[1], cmd[2]
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(engine))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)

    def _add(self, engine: LLMEngine, stream: GenerationStream, prompts: list,
             params: Union[SamplingParams, list[SamplingParams]], arrival: float) -> None:
        if stream.error is not None:  # timed out or disconnected while queued
            return
        if self.asleep:
            self._post(stream, stream._admit, ApiError(503, ASLEEP, None, "not_ready"))
            return
        added = []
        for i, (rid, prompt) in enumerate(zip(stream.request_ids, prompts)):
            try:
                engine.add_request(rid, prompt, params[i] if isinstance(params, list) else params, arrival_time=arrival)
            except (RequestError, ConfigError) as exc:
                error = ApiError(400, str(exc) if len(prompts) == 1 else f"prompt {i}: {exc}",
                                 param_from_message(str(exc)), "invalid_request")
            except Exception as exc:  # noqa: BLE001 - an engine bug must not take the server down
                logger.exception("rlt-serve: add_request failed")
                error = ApiError(500, f"internal error while admitting the request: {exc}", None, "internal_error")
            else:
                added.append(rid)
                continue
            for done in added:
                engine.abort_request(done)
            self._post(stream, stream._admit, error)
            return
        for i, rid in enumerate(stream.request_ids):
            self._active[rid] = _Active(stream, i, RequestTimer(arrival))
            n_prompt = len(prompts[i]["prompt_token_ids"] if isinstance(prompts[i], dict) else prompts[i])
            self.metrics.admitted(n_prompt)
        self._streams[stream] = len(stream.request_ids)
        self._post(stream, stream._admit, None)

    def _abort(self, engine: LLMEngine, stream: GenerationStream) -> None:
        now = time.monotonic()
        for rid in stream.request_ids:
            entry = self._active.get(rid)
            if entry is None:
                continue
            out = engine.abort_request(rid, deltas=True)
            if out is not None:
                self._publish(out, now)

    def _publish(self, out: RequestOutput, now: float) -> None:
        entry = self._active.get(out.request_id)
        if entry is None:
            return
        self.metrics.observe(entry.timer, out, now)
        if out.error is not None:
            logger.error("rlt-serve: request %s failed: %s", out.request_id, out.error)
            self._post(entry.stream, entry.stream.fail, ApiError(500, f"the engine failed: {out.error}", None,
                                                                 "internal_error"))
        else:
            self._post(entry.stream, entry.stream._deliver, entry.index, out)
        if out.finished:
            del self._active[out.request_id]
            left = self._streams[entry.stream] - 1
            if left:
                self._streams[entry.stream] = left
            else:
                del self._streams[entry.stream]

    def _post(self, stream: GenerationStream, fn: Callable, *args) -> None:
        self._posts.setdefault(stream.loop, []).append((fn, args))

    def _flush(self) -> None:
        """Hand this iteration's deliveries to each event loop in one call."""
        posts, self._posts = self._posts, {}
        for loop, items in posts.items():
            try:
                loop.call_soon_threadsafe(_run_posts, items)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                for fn, _ in items:
                    stream = getattr(fn, "__self__", None)
                    if isinstance(stream, GenerationStream):
                        self._inbox.put(("abort", stream))

    def _stop_all(self, engine: LLMEngine) -> None:
        """Abort everything still running and fail its streams (shutdown or engine failure)."""
        if self.failure is not None:
            error = ApiError(500, "the engine failed; see the server log", None, "internal_error")
        else:
            error = ApiError(503, "the server is shutting down", None, "shutting_down")
        for rid in list(self._active):
            try:
                engine.abort_request(rid)
            except Exception:  # noqa: BLE001 - best effort on the way out
                logger.exception("rlt-serve: abort during shutdown failed")
        for stream in {e.stream for e in self._active.values()}:
            self._post(stream, stream.fail, error)
        while True:  # requests queued but never admitted
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            if cmd is not _STOP and cmd[0] == "add":
                self._post(cmd[1], cmd[1].fail, error)
            elif cmd is not _STOP and cmd[0] == "call":
                cmd[2].set_exception(WorkerUnavailable(self.status))
        self._active.clear()
        self._streams.clear()
        self._closing = True
        self._flush()
        self.metrics.update_engine(engine.stats())


def _run_posts(items: list) -> None:
    for fn, args in items:
        fn(*args)
