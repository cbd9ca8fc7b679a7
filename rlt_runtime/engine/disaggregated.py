"""DisaggregatedEngine: a prefill engine and a decode engine behind the LLMEngine surface.

`disaggregated_prefill=True` starts two engines with the same options, each in its own process on
its own device (cuda:0 prefill, cuda:1 decode; both on the CPU without CUDA). The front end
tokenizes, gives every request its global arrival index and sends it to the prefill engine, which
computes the prompt (every plane's K/V and the key-depth table) and samples the first token, then
hands the request off (engine/kv_transfer.py): its K/V goes to the decode engine over
torch.distributed point-to-point (gloo on CPU, NCCL on CUDA) and its metadata through the front
end, which forwards it to the decode engine and from then on collects the request's outputs there.
A request that finishes with its first token (EOS, a stop, max_tokens=1) never leaves the prefill
engine. Speculative decoding, when configured, runs on the decode engine only.

Message flow (plain data on the pipes, process_replica.py's protocol plus two messages):

  prefill child -> front end   ("handoff", meta)   after posting the K/V sends to the decode rank
  front end -> decode child    ("import", meta)    the decode child receives the K/V, then imports

Aborts go to whichever engine holds the request; one on its way is forwarded first and aborted on
the decode engine, so blocks are freed on both sides. A failed prefill engine ends the requests
it holds with finish_reason "error" (handed-off ones decode on); a failed decode engine ends every
request (those on the prefill engine are aborted there). After either, new requests are refused.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing.connection
import os
import queue
import socket
import time
from typing import Optional, Union

import torch

from .. import errors
from ..config import EngineConfig
from ..errors import ConfigError, ReplicaError, RequestError
from ..models.generation_defaults import generation_defaults
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from .data_parallel import (
    WAIT_S, DataParallelEngine, _config_and_tokenizer, _replica_options, _sum_speculative, error_output,
)
from .kv_transfer import (
    DECODE_RANK, PREFILL_RANK, Handoff, close_transfer_group, export_handoffs, import_handoff, init_transfer_group,
    recv_tensors, send_tensors,
)
from .llm_engine import tokenize_prompt
from .process_replica import STATS_INTERVAL_S, ChildHooks, ProcessReplica
from .replica import Replica, ReplicaEngineCalls, call_engine
from .wire import output_to_dict

logger = logging.getLogger("rlt")

BACKENDS = ("process", "inprocess")
PREFILL, DECODE = "prefill", "decode"


def role_sizes(cfg: EngineConfig) -> tuple[int, int]:
    """(prefill, decode) tensor-parallel sizes: prefill_tensor_parallel_size (default: the same)
    and tensor_parallel_size. The handoff carries whole K/V heads, so they may differ."""
    tp = cfg.tensor_parallel_size
    return (cfg.prefill_tensor_parallel_size or tp), tp


def role_devices(cfg: EngineConfig) -> tuple[str, str]:
    """(prefill device, decode device): cuda:0 and cuda:P when CUDA is in use (the prefill
    engine's P ranks take cuda:0..P-1, the decode engine's T ranks the T GPUs from cuda:P; see
    `role_sizes`), else the CPU for both (ConfigError for device='cuda:K', or CUDA with fewer than
    P + T devices)."""
    device = cfg.device
    prefill_tp, decode_tp = role_sizes(cfg)
    if device == "cpu":
        return "cpu", "cpu"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.startswith("cuda:"):
        raise ConfigError(f"device={device!r} names one GPU but disaggregated_prefill=True runs the prefill and the "
                          f"decode engine on GPUs of their own; use device='cuda' or 'auto' (cuda:0 and "
                          f"cuda:{prefill_tp}) or device='cpu'")
    if device == "auto" and count == 0:
        return "cpu", "cpu"
    if count < prefill_tp + decode_tp:
        raise ConfigError(f"disaggregated_prefill=True needs {prefill_tp + decode_tp} CUDA devices (a prefill engine of "
                          f"{prefill_tp} and a decode engine of {decode_tp} tensor-parallel ranks) with "
                          f"device={device!r}, found {count}; set device='cpu' or turn disaggregated_prefill off")
    return "cuda:0", f"cuda:{prefill_tp}"


def role_options(cfg: EngineConfig, role: str) -> dict:
    """One role's engine options as plain data: one engine of its own tensor-parallel size (`role_sizes`),
    no speculation on the prefill side."""
    out = _replica_options(cfg, 0 if role == PREFILL else 1)
    out["disaggregated_prefill"] = False
    out["prefill_tensor_parallel_size"] = None
    for name in ("prefill_address", "decode_address", "role", "role_address", "kv_transfer_address"):
        out[name] = None  # the engine itself is a plain one
    out["tensor_parallel_size"] = role_sizes(cfg)[0 if role == PREFILL else 1]
    if role == PREFILL:
        out["speculative_config"] = None
    if cfg.profile_dir:
        out["profile_dir"] = os.path.join(cfg.profile_dir, role)
    return out


@dataclasses.dataclass
class _Tracked:
    """A request the front end sent and has not seen finish; `role`: the engine that holds it."""

    role: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    last: Optional[RequestOutput] = None
    sent: dict = dataclasses.field(default_factory=dict)  # as data_parallel._Tracked (deltas)
    prompt_logprobs_sent: int = 0


class DisaggregatedEngine(ReplicaEngineCalls):
    """A prefill engine and a decode engine behind one add/abort/step/stats surface.

    backend: "process" (each engine in its own process, K/V over torch.distributed, the default)
    or "inprocess" (both in this process, stepped in turn, K/V handed over as host tensors: tests).
    """

    def __init__(self, model: str, cfg: Optional[EngineConfig] = None, *, backend: str = "process", **kwargs):
        cfg = cfg or EngineConfig.from_kwargs(**dict(kwargs, disaggregated_prefill=True))
        cfg.validate_static()
        if backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if cfg.record_exit_trace:
            raise ConfigError("record_exit_trace cannot be combined with disaggregated_prefill=True (both engines "
                              "would write the file); record with one engine: its depths are the same")
        remote = cfg.prefill_address is not None
        devices = (cfg.prefill_address, cfg.decode_address) if remote else role_devices(cfg)
        self.cfg = cfg
        self.model_name = model
        self.model_config, self.tokenizer = _config_and_tokenizer(model, cfg)
        self.generation_defaults = generation_defaults(model, cfg)
        self.prefill, self.decode = _start_roles(model, cfg, devices, backend)
        info = self.prefill.info
        self.max_model_len, self.depth = info["max_model_len"], info["depth"]
        self.device = torch.device("cpu")  # the front end runs nothing on a device
        self._tracked: dict[str, _Tracked] = {}
        self._arrivals = itertools.count()
        self._failures_handled: set[str] = set()
        self.num_handoffs = 0

    @property
    def workers(self) -> list[Replica]:
        return [self.prefill, self.decode]

    call_targets = workers  # (the engine calls reach both roles)

    @property
    def failure(self) -> Optional[str]:
        return self.prefill.failure or self.decode.failure

    # ---- requests ------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Union[str, list[int], dict, None],
                    params: Optional[SamplingParams] = None, *, arrival_time: Optional[float] = None) -> None:
        """Queue a request on the prefill engine, which validates it (its errors are raised here)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise RequestError("sampling_params must be a SamplingParams")
        request_id = str(request_id)
        if request_id in self._tracked:
            raise RequestError(f"request_id {request_id!r} is already in use")
        if self.failure is not None:
            raise ReplicaError(f"the disaggregated engine cannot serve: {self.failure}")
        text, ids = tokenize_prompt(prompt, self.tokenizer)
        now = time.monotonic() if arrival_time is None else arrival_time
        arrival = next(self._arrivals)
        try:
            self.prefill.add_request(request_id, {"prompt_token_ids": ids, "prompt": text}, params,
                                     arrival_time=now, arrival_index=arrival)
        except Exception:
            self._arrivals = itertools.count(arrival)  # rejected requests take no place in the order
            raise
        self._tracked[request_id] = _Tracked(PREFILL, text, ids, params)

    def abort_request(self, request_id: str, deltas: bool = False) -> Optional[RequestOutput]:
        """Abort a request where it is (forwarding it to the decode engine first when its handoff is
        under way); returns its final output, or None when it is unknown or already finished."""
        request_id = str(request_id)
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return None
        out = None
        if tracked.role == PREFILL:
            out = self._abort_on(self.prefill, request_id)
            if out is None:
                self._forward_handoffs()  # it left the prefill engine (or finished there: step delivers it)
        if out is None and tracked.role == DECODE:
            out = self._abort_on(self.decode, request_id)
        if out is None:
            return None
        self._settle(request_id, tracked, out)
        return DataParallelEngine._delta(tracked, out) if deltas else out

    @staticmethod
    def _abort_on(worker: Replica, request_id: str) -> Optional[RequestOutput]:
        try:
            return worker.abort_request(request_id) if worker.alive else None
        except ReplicaError:
            return None

    def has_unfinished_requests(self) -> bool:
        return bool(self._tracked)

    # ---- outputs -------------------------------------------------------------------------------------
    def step(self, final_only: bool = False, deltas: bool = False) -> list[RequestOutput]:
        """Outputs since the last call (waiting up to WAIT_S for some when the engines run in other
        processes); same meaning as LLMEngine.step."""
        outs = self._collect(final_only, deltas)
        if not outs and self._tracked:
            handles = [h for w in self.workers for h in w.wait_handles()]
            if handles and len(handles) == sum(w.alive for w in self.workers):
                multiprocessing.connection.wait(handles, timeout=WAIT_S)
                outs = self._collect(final_only, deltas)
        return outs

    def _collect(self, final_only: bool, deltas: bool) -> list[RequestOutput]:
        outs = []
        busy = {tracked.role for tracked in self._tracked.values()}
        for worker in self.workers:
            if worker.alive:
                worker.check_responsive(worker.role in busy)
        if self.prefill.alive:  # only final outputs: a handed-off request never shows there
            outs += self._deliver(self.prefill.poll(True), deltas)
        self._forward_handoffs()
        if self.decode.alive:
            outs += self._deliver(self.decode.poll(final_only), deltas)
        outs += self._handle_failures(deltas)
        return outs

    def _deliver(self, outputs: list[RequestOutput], deltas: bool) -> list[RequestOutput]:
        outs = []
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:  # aborted meanwhile
                continue
            self._settle(out.request_id, tracked, out)
            outs.append(DataParallelEngine._delta(tracked, out) if deltas else out)
        return outs

    def _forward_handoffs(self) -> None:
        """Send the prefill engine's finished handoffs to the decode engine (always: the decode side
        must receive every K/V transfer the prefill side posted)."""
        for handoff in self.prefill.take_handoffs():
            tracked = self._tracked.get(handoff.request_id)
            if tracked is not None:
                tracked.role = DECODE
            self.num_handoffs += 1
            if self.decode.alive:
                self.decode.import_handoff(handoff)

    def _settle(self, request_id: str, tracked: _Tracked, out: RequestOutput) -> None:
        if out.finished:
            self._tracked.pop(request_id, None)
        else:
            tracked.last = out

    def _handle_failures(self, deltas: bool) -> list[RequestOutput]:
        """End the requests a failed engine strands with finish_reason "error": a failed prefill
        engine strands those it holds (handed-off requests decode on), a failed decode engine every
        request (those still on the prefill engine are aborted there, freeing their blocks)."""
        outs = []
        for worker in self.workers:
            if worker.failure is None or worker.role in self._failures_handled:
                continue
            self._failures_handled.add(worker.role)
            logger.error("disaggregated prefill: %s; new requests are refused", worker.failure)
            victims = [rid for rid, t in self._tracked.items() if worker.role == DECODE or t.role == PREFILL]
            for rid in victims:
                if worker.role == DECODE and self._tracked[rid].role == PREFILL:
                    self._abort_on(self.prefill, rid)
                outs.append(self._fail(rid, f"{worker.failure}; the request did not finish", deltas))
        return outs

    def _fail(self, request_id: str, message: str, deltas: bool) -> RequestOutput:
        tracked = self._tracked[request_id]
        out = error_output(request_id, tracked, message)
        self._settle(request_id, tracked, out)
        return DataParallelEngine._delta(tracked, out) if deltas else out

    # ---- stats and lifecycle ------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters summed over both engines, the queues of both, KV usage over both pools, and each
        engine's identity, health and stats under "disaggregated_prefill"."""
        per = {PREFILL: self.prefill.stats(), DECODE: self.decode.stats()}
        both = list(per.values())
        out = {key: sum(s.get(key, 0) for s in both) for key in ("steps", "prefix_cache_queries", "prefix_cache_hits",
                                                                   "preemptions", "running", "waiting", "kv_blocks")}
        out["kv_usage"] = (sum(s.get("kv_usage", 0.0) * s.get("kv_blocks", 0) for s in both) / out["kv_blocks"]
                           if out["kv_blocks"] else 0.0)
        dec = per[DECODE]
        out["execution_mode"], out["async_scheduling"] = dec.get("execution_mode"), dec.get("async_scheduling")
        out["speculative"] = _sum_speculative([s.get("speculative") for s in both])
        roles = {}
        for role, worker in ((PREFILL, self.prefill), (DECODE, self.decode)):
            mine = sum(t.role == role for t in self._tracked.values())
            roles[role] = dict(worker.describe(), outstanding_requests=mine, stats=per[role])
        out["disaggregated_prefill"] = dict(roles, handoffs=self.num_handoffs)
        return out

    def shutdown(self) -> None:
        """Stop both engines (idempotent)."""
        for worker in self.workers:
            worker.shutdown()


# ---- the engines -----------------------------------------------------------------------------------------
class InProcessRole(Replica):
    """An engine of one role in this process; `poll` runs one of its steps. The prefill role keeps
    its handoffs (with their host tensors) until `take_handoffs`."""

    def __init__(self, index: int, role: str, engine):
        self.index, self.role, self.engine = index, role, engine
        self.info = {"model_name": engine.model_name, "max_model_len": engine.max_model_len, "depth": engine.depth,
                     "device": str(engine.device), "role": role}
        engine.scheduler.hold_decodes = role == PREFILL
        self._handoffs: list[Handoff] = []
        self._outputs: list[RequestOutput] = []

    def add_request(self, request_id, prompt, params, *, arrival_time, arrival_index):
        self.engine.add_request(request_id, prompt, params, arrival_time=arrival_time, arrival_index=arrival_index)

    def abort_request(self, request_id):
        return self.engine.abort_request(request_id)

    def poll(self, final_only):
        if self.alive and self.engine.has_unfinished_requests():
            try:
                self._outputs += self.engine.step(final_only=final_only)
                if self.role == PREFILL:
                    self._handoffs += export_handoffs(self.engine)
            except Exception as exc:  # noqa: BLE001 - the front end fails the requests
                self.failure = f"the {self.role} engine ({self.info['device']}) failed: {exc!r}"
        outs, self._outputs = self._outputs, []
        return outs

    def take_handoffs(self) -> list[Handoff]:
        out, self._handoffs = self._handoffs, []
        return out

    def import_handoff(self, handoff: Handoff) -> None:
        try:
            import_handoff(self.engine, handoff)
        except errors.RltError as exc:
            self._outputs.append(_import_error(handoff, exc))

    def stats(self):
        return self.engine.stats()

    def call(self, method, *args):
        return call_engine(self.engine, method, *args)

    def shutdown(self):
        self.engine.shutdown()  # a tensor-parallel engine's rank processes


class ProcessRole(ProcessReplica):
    """Front-end side of one role's engine process (process_replica.py's pipe protocol, plus the
    prefill child's "handoff" messages and the decode child's "import" command)."""

    def __init__(self, index: int, role: str, model: str, config: dict, device: str, num_threads: int, context,
                 init_method: str, step_timeout_s: Optional[float] = None, connection: Optional[tuple] = None):
        """connection: (connection, RemoteProcess) to an engine started apart (remote_role.py), which
        then serves this role instead of a process started here."""
        super().__init__(index, model, config, device, num_threads, context, RoleHooks(role, device, init_method),
                         step_timeout_s, connection=connection)
        self.role = role
        self.label = f"the {role} engine"
        self.info["role"] = role
        self._handoffs: list[Handoff] = []

    def wait_ready(self) -> None:
        try:
            super().wait_ready()
        except errors.RltError as exc:
            raise type(exc)(str(exc).replace(f"data-parallel replica {self.index}", f"the {self.role} engine")) from None

    def _handle(self, msg) -> None:
        if msg is not None and msg[0] == "handoff":
            self._handoffs.append(Handoff(msg[1], []))  # the K/V travels between the engines directly
            return
        super()._handle(msg)
        if msg is not None and msg[0] == "failed":
            self.failure = f"the {self.role} engine ({self.info['device']}) failed: {msg[2]}"

    def _died(self) -> None:
        if self.failure is None:
            super()._died()
            self.failure = self.failure.replace(f"data-parallel replica {self.index}", f"the {self.role} engine")

    def take_handoffs(self) -> list[Handoff]:
        while self.alive and self._conn_ready():
            self._handle(self._receive())
        out, self._handoffs = self._handoffs, []
        return out

    def import_handoff(self, handoff: Handoff) -> None:
        self._send(("import", handoff.meta))


def _import_error(handoff: Handoff, exc: Exception) -> RequestOutput:
    """The final output of a handed-off request the decode engine rejected."""
    meta = handoff.meta
    n = meta["params"].get("n", 1)
    samples = [CompletionOutput(index=i, text="", token_ids=[], exit_depths=[], finish_reason="error") for i in range(n)]
    return RequestOutput(meta["request_id"], meta["prompt"], list(meta["prompt_token_ids"]), samples, True,
                         error=f"the decode engine rejected the request: {exc}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_roles(model: str, cfg: EngineConfig, devices: tuple[str, str], backend: str):
    roles = (PREFILL, DECODE)
    if backend == "inprocess":
        from .llm_engine import LLMEngine

        return tuple(InProcessRole(i, role, LLMEngine(model, EngineConfig.from_kwargs(
            **dict(role_options(cfg, role), device=device)))) for i, (role, device) in enumerate(zip(roles, devices)))
    remote = cfg.prefill_address is not None  # engines started apart: connect to them
    if remote:
        from .remote_role import connect_role
    else:
        context = torch.multiprocessing.get_context("spawn")
        threads = max(1, (os.cpu_count() or 1) // 2)
        init_method = f"tcp://127.0.0.1:{_free_port()}"
    workers = []
    try:
        for i, (role, device) in enumerate(zip(roles, devices)):
            if remote:  # `device` is the engine's address; it was built with its own options
                workers.append(ProcessRole(i, role, model, {}, device, 1, None, "", cfg.step_timeout_s,
                                           connection=connect_role(role, device)))
            else:
                workers.append(ProcessRole(i, role, model, role_options(cfg, role), device, threads, context,
                                           init_method, cfg.step_timeout_s))
        for worker in workers:  # they load in parallel; wait for each in turn
            worker.wait_ready()
        if remote:
            _check_roles_agree(*workers)
    except BaseException:
        for worker in workers:
            worker.shutdown()
        raise
    return tuple(workers)


def _check_roles_agree(prefill: Replica, decode: Replica) -> None:
    """Engines started apart must run the same model at the same depth and context length."""
    for key in ("model_name", "depth", "max_model_len"):
        if prefill.info.get(key) != decode.info.get(key):
            raise ConfigError(f"the prefill and decode engines differ in {key}: {prefill.info.get(key)!r} against "
                              f"{decode.info.get(key)!r}; start both with the same model and options")


# ---- child processes ------------------------------------------------------------------------------------
class RoleHooks(ChildHooks):
    """A role's additions to a replica process (process_replica.py): join the K/V transfer group
    before the engine is built; the prefill engine holds decodes, returns finished requests only
    and, after each step, posts its handoffs' K/V sends and tells the front end; the decode engine
    receives the K/V of each "import" and queues the request."""

    def __init__(self, role: str, device: str, init_method: str):
        self.role, self.device, self.init_method = role, device, init_method
        self.name = role
        self._sending: list = []  # (work, tensor) of posted K/V sends, kept alive until they complete

    def before_engine(self, device: str) -> None:
        init_transfer_group(PREFILL_RANK if self.role == PREFILL else DECODE_RANK, self.init_method, device)

    def engine_built(self, engine) -> None:
        engine.scheduler.hold_decodes = self.role == PREFILL

    def final_only(self, asked: bool) -> bool:
        return asked or self.role == PREFILL

    def _pending_sends(self) -> list:
        self._sending = [(w, t) for w, t in self._sending if not w.is_completed()]
        return self._sending

    def idle_wait(self) -> Optional[float]:
        return STATS_INTERVAL_S if self._pending_sends() else None

    def command(self, engine, cmd: tuple, outbox: queue.SimpleQueue) -> bool:
        if cmd[0] != "import":
            return False
        handoff = Handoff(cmd[1], recv_tensors([s for x in cmd[1]["samples"] for s in x["kv"] or ()], self.device))
        try:
            import_handoff(engine, handoff)
        except errors.RltError as exc:
            outbox.put(("outputs", [output_to_dict(_import_error(handoff, exc))], None))
        return True

    def after_step(self, engine, outbox: queue.SimpleQueue) -> None:
        if self.role != PREFILL:
            return
        self._pending_sends()
        for handoff in export_handoffs(engine):
            self._sending += send_tensors(handoff.tensors, self.device)
            outbox.put(("handoff", handoff.meta))

    def close(self) -> None:
        close_transfer_group()
