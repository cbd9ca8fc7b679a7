"""DataParallelEngine: N engine replicas behind the LLMEngine surface `LLM` and the server use.

The front end tokenizes, picks a replica per request (routing.py: least outstanding work, the
same first prompt block to the same replica), gives every request its global arrival index (so
unseeded samples draw the random streams one engine would give them) and collects the
replicas' outputs. Batch invariance makes each request's tokens, logprobs and exit depths those
of a single engine, whichever replica runs it and whoever its neighbours are.

A replica that fails is logged and reported in `stats()`; its unfinished requests end with
finish_reason "error" and `RequestOutput.error` saying which replica failed and how; new
requests go to the others. With every replica failed, `add_request` raises ReplicaError.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing.connection
import os
import time
import weakref
from typing import Optional, Union

import torch

from ..config import EngineConfig, SpeculativeConfig
from ..errors import ConfigError, ReplicaError, RequestError
from ..models.generation_defaults import generation_defaults
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from .llm_engine import tokenize_prompt
from .replica import InProcessReplica, Replica, ReplicaEngineCalls
from .routing import Router

logger = logging.getLogger("rlt")

BACKENDS = ("process", "inprocess", "ray")
WAIT_S = 0.02  # longest a step waits for replica outputs before returning (the caller loops)


def replica_devices(cfg: EngineConfig) -> list[str]:
    """Each replica's device: cuda:(r*T) for replica r when CUDA is in use (its T =
    tensor_parallel_size ranks take cuda:(r*T)..cuda:(r*T+T-1)), else the CPU for all (ConfigError
    when CUDA is asked for, or available under device='auto', with fewer than N*T devices)."""
    n, tp, device = cfg.data_parallel_size, cfg.tensor_parallel_size, cfg.device
    if device == "cpu":
        return ["cpu"] * n
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.startswith("cuda:"):
        if n > 1:
            raise ConfigError(f"device={device!r} names one GPU but data_parallel_size={n} runs one replica per GPU; "
                              "use device='cuda' or 'auto' (replicas on cuda:0..N-1) or device='cpu'")
        return [device]
    if device == "auto" and count == 0:
        return ["cpu"] * n
    if count < n * tp:
        raise ConfigError(f"data_parallel_size ({n}) x tensor_parallel_size ({tp}) must be at most the number of CUDA "
                          f"devices ({count}) with device={device!r}: each replica takes tensor_parallel_size GPUs, "
                          f"{n * tp} in all; lower data_parallel_size or tensor_parallel_size, or set device='cpu'")
    return [f"cuda:{i * tp}" for i in range(n)]


def build_engine(model: str, cfg: Optional[EngineConfig] = None, **kwargs):
    """An LLMEngine, a DataParallelEngine when data_parallel_size > 1 or replicas run on Ray, or a
    DisaggregatedEngine with disaggregated_prefill=True."""
    from .llm_engine import LLMEngine

    cfg = cfg or EngineConfig.from_kwargs(**kwargs)
    cfg.validate_static()
    if cfg.role is not None:
        raise ConfigError(f"role={cfg.role!r} serves one engine of disaggregated prefill to a front end started apart: "
                          "run it with rlt-serve --role (engine.remote_role.serve_role), not as an engine here")
    if cfg.disaggregated_prefill:
        from .disaggregated import DisaggregatedEngine

        return DisaggregatedEngine(model, cfg)
    if cfg.data_parallel_size == 1 and cfg.distributed_executor == "mp":
        return LLMEngine(model, cfg)
    return DataParallelEngine(model, cfg)


def _replica_options(cfg: EngineConfig, index: int) -> dict:
    """Replica `index`'s engine options as plain data: data_parallel_size 1, profiles in a
    subdirectory of profile_dir of their own (the device is set per replica)."""
    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "extra"}
    if isinstance(out["speculative_config"], SpeculativeConfig):
        out["speculative_config"] = dataclasses.asdict(out["speculative_config"])
    out["data_parallel_size"] = 1
    if cfg.profile_dir:
        out["profile_dir"] = os.path.join(cfg.profile_dir, f"replica-{index}")
    return out


@dataclasses.dataclass
class _Tracked:
    """A request the front end routed and has not seen finish."""

    replica: int
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    work: int
    last: Optional[RequestOutput] = None
    sent: dict = dataclasses.field(default_factory=dict)  # sample index -> (entries, text chars) sent as deltas
    prompt_logprobs_sent: int = 0  # prompt log-probability entries sent as deltas


def error_output(request_id: str, tracked, message: str) -> RequestOutput:
    """The final output of a request a failure ended: the samples of its last output (unfinished
    ones with finish_reason "error"), or n empty error samples. tracked: the front end's record
    (prompt, prompt_token_ids, params, last output or None)."""
    last = tracked.last
    if last is not None and last.outputs:
        samples = [dataclasses.replace(c, finish_reason=c.finish_reason or "error") for c in last.outputs]
    else:
        samples = [CompletionOutput(index=i, text="", token_ids=[], exit_depths=[], finish_reason="error")
                   for i in range(tracked.params.n)]
    return RequestOutput(request_id, tracked.prompt, list(tracked.prompt_token_ids), samples, True,
                         metrics=None if last is None else last.metrics,
                         prompt_logprobs=None if last is None else last.prompt_logprobs, error=message)


class DataParallelEngine(ReplicaEngineCalls):
    """`data_parallel_size` LLMEngine replicas, one per device, behind one add/abort/step/stats surface.

    backend: "process" (each replica in its own process), "ray" (each replica a Ray actor:
    ray_replica.py) or "inprocess" (all in this process, stepped in turn: for tests and
    debugging); default: "ray" with distributed_executor="ray", else "process".
    """

    def __init__(self, model: str, cfg: Optional[EngineConfig] = None, *, backend: Optional[str] = None, **kwargs):
        cfg = cfg or EngineConfig.from_kwargs(**kwargs)
        cfg.validate_static()
        backend = backend or ("ray" if cfg.distributed_executor == "ray" else "process")
        if backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
        if cfg.record_exit_trace:
            raise ConfigError("record_exit_trace cannot be combined with data_parallel_size > 1 (every replica would "
                              "write the file); record with one engine: its depths are those of every replica")
        if backend == "ray":
            from .ray_replica import ray_replica_devices

            devices = ray_replica_devices(cfg)
        else:
            devices = replica_devices(cfg)
        self.cfg = cfg
        self.model_name = model
        self.model_config, self.tokenizer = _config_and_tokenizer(model, cfg)
        self.generation_defaults = generation_defaults(model, cfg)
        self.replicas: list[Replica] = _start_replicas(model, cfg, devices, backend)
        self._shutdown = weakref.finalize(self, _shutdown_all, self.replicas)
        info = self.replicas[0].info
        self.max_model_len, self.depth = info["max_model_len"], info["depth"]
        self.device = torch.device("cpu")  # the front end runs nothing on a device (the replicas' are in stats)
        self.router = Router(len(self.replicas), cfg.block_size)
        self._tracked: dict[str, _Tracked] = {}
        self._arrivals = itertools.count()
        self._failures_handled: set[int] = set()

    # ---- requests ------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Union[str, list[int], dict, None],
                    params: Optional[SamplingParams] = None, *, arrival_time: Optional[float] = None) -> None:
        """Route and queue a request; the chosen replica validates it (its errors are raised here)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise RequestError("sampling_params must be a SamplingParams")
        request_id = str(request_id)
        if request_id in self._tracked:
            raise RequestError(f"request_id {request_id!r} is already in use")
        text, ids = self._tokenize(prompt)
        now = time.monotonic() if arrival_time is None else arrival_time
        arrival = next(self._arrivals)
        while True:
            alive = [r.alive for r in self.replicas]
            if not any(alive):
                self._arrivals = itertools.count(arrival)
                raise ReplicaError("every data-parallel replica has failed: "
                                   + "; ".join(r.failure for r in self.replicas))
            index = self.router.choose(ids, alive)
            try:
                self.replicas[index].add_request(request_id, {"prompt_token_ids": ids, "prompt": text}, params,
                                                 arrival_time=now, arrival_index=arrival)
                break
            except ReplicaError:  # it failed just now: the next step reports it; try another
                continue
            except Exception:
                self._arrivals = itertools.count(arrival)  # rejected requests take no place in the order
                raise
        room = max(self.max_model_len - len(ids), 0)
        max_new = min(params.max_tokens or room, room)
        work = len(ids) + params.num_samples * max_new
        self._tracked[request_id] = _Tracked(index, text, ids, params, max_new, work)
        self.router.add(index, work)

    def _tokenize(self, prompt) -> tuple[Optional[str], list]:
        """(text or None, token ids) of a prompt; the ids are checked by the replica."""
        return tokenize_prompt(prompt, self.tokenizer)

    def abort_request(self, request_id: str, deltas: bool = False) -> Optional[RequestOutput]:
        """Abort a request on the replica that runs it; returns its final output (None when the
        request is unknown, or already finished with its output on the way); `deltas` as in step()."""
        request_id = str(request_id)
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return None
        replica = self.replicas[tracked.replica]
        try:
            out = replica.abort_request(request_id) if replica.alive else None
        except ReplicaError:
            out = None
        if out is None:
            return None  # finished (its output is buffered) or the replica failed: step() delivers it
        self._settle(request_id, tracked, out)
        return self._delta(tracked, out) if deltas else out

    def has_unfinished_requests(self) -> bool:
        return bool(self._tracked)

    # ---- outputs -------------------------------------------------------------------------------------
    def step(self, final_only: bool = False, deltas: bool = False) -> list[RequestOutput]:
        """Outputs the replicas produced since the last call (waiting up to WAIT_S for some when
        replicas run in other processes); same meaning as LLMEngine.step. Replicas send whole
        outputs; deltas=True cuts them here into what each sample added since the last delta."""
        outs = self._collect(final_only, deltas)
        if not outs and self._tracked:
            handles = [h for r in self.replicas for h in r.wait_handles()]
            steps_here = any(r.alive and not r.wait_handles() for r in self.replicas)
            if handles and not steps_here:
                multiprocessing.connection.wait(handles, timeout=WAIT_S)
                outs = self._collect(final_only, deltas)
        return outs

    def _collect(self, final_only: bool, deltas: bool) -> list[RequestOutput]:
        outs = []
        busy = {tracked.replica for tracked in self._tracked.values()}
        for replica in self.replicas:
            if replica.alive:
                replica.check_responsive(replica.index in busy)
        for replica in self.replicas:
            if not replica.alive:
                continue
            for out in replica.poll(final_only):
                tracked = self._tracked.get(out.request_id)
                if tracked is None:  # aborted meanwhile
                    continue
                self._settle(out.request_id, tracked, out)
                outs.append(self._delta(tracked, out) if deltas else out)
        for replica in self.replicas:
            if not replica.alive and replica.index not in self._failures_handled:
                outs.extend(self._fail_requests(replica, deltas))
        return outs

    @staticmethod
    def _delta(tracked: _Tracked, out: RequestOutput) -> RequestOutput:
        """The part of whole output `out` not yet sent as deltas for this request (whole outputs
        only grow: text held back for a possible stop string is never shown and then cut)."""
        samples = []
        for c in out.outputs:
            n, chars = tracked.sent.get(c.index, (0, 0))
            tracked.sent[c.index] = (len(c.token_ids), len(c.text))
            samples.append(dataclasses.replace(
                c, text=c.text[chars:], token_ids=c.token_ids[n:], exit_depths=c.exit_depths[n:],
                logprobs=None if c.logprobs is None else c.logprobs[n:]))
        prompt_logprobs = None
        if out.prompt_logprobs is not None and len(out.prompt_logprobs) > tracked.prompt_logprobs_sent:
            prompt_logprobs = out.prompt_logprobs[tracked.prompt_logprobs_sent:]
            tracked.prompt_logprobs_sent = len(out.prompt_logprobs)
        return dataclasses.replace(out, outputs=samples, prompt_logprobs=prompt_logprobs)

    def _settle(self, request_id: str, tracked: _Tracked, out: RequestOutput) -> None:
        """Record an output: the request's remaining work, or its end."""
        if out.finished:
            remaining = 0
            del self._tracked[request_id]
        else:
            made = [len(c.token_ids) for c in out.outputs]
            remaining = (0 if any(made) else len(tracked.prompt_token_ids)) + sum(
                max(tracked.max_new_tokens - m, 0) for m in made) + (
                tracked.params.num_samples - len(made)) * tracked.max_new_tokens
            tracked.last = out
        self.router.add(tracked.replica, remaining - tracked.work)
        tracked.work = remaining

    def _fail_requests(self, replica: Replica, deltas: bool = False) -> list[RequestOutput]:
        """End the requests of a failed replica with finish_reason "error"."""
        self._failures_handled.add(replica.index)
        alive = sum(r.alive for r in self.replicas)
        logger.error("%s; %d of %d replicas still serve", replica.failure, alive, len(self.replicas))
        message = f"{replica.failure}; the request did not finish"
        outs = []
        for request_id, tracked in list(self._tracked.items()):
            if tracked.replica != replica.index:
                continue
            out = error_output(request_id, tracked, message)
            self._settle(request_id, tracked, out)
            outs.append(self._delta(tracked, out) if deltas else out)
        return outs

    @property
    def call_targets(self) -> list[Replica]:
        return self.replicas

    # ---- stats and lifecycle ------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters summed over every replica (a failed one's last snapshot included), gauges over
        live replicas, and per-replica identity, health, routing load and stats under "data_parallel"."""
        per = [r.stats() for r in self.replicas]
        live = [s for r, s in zip(self.replicas, per) if r.alive]
        out = {key: sum(s.get(key, 0) for s in per) for key in ("steps", "prefix_cache_queries", "prefix_cache_hits",
                                                                  "preemptions")}
        for key in ("running", "waiting", "kv_blocks"):
            out[key] = sum(s.get(key, 0) for s in live)
        out["kv_usage"] = (sum(s.get("kv_usage", 0.0) * s.get("kv_blocks", 0) for s in live) / out["kv_blocks"]
                           if out["kv_blocks"] else 0.0)
        first = per[0]
        out["execution_mode"], out["async_scheduling"] = first.get("execution_mode"), first.get("async_scheduling")
        out["speculative"] = _sum_speculative([s.get("speculative") for s in per])
        replicas = []
        for r, s in zip(self.replicas, per):
            mine = [t for t in self._tracked.values() if t.replica == r.index]
            replicas.append(dict(r.describe(), outstanding_requests=len(mine), outstanding_work=self.router.work[r.index],
                                 stats=s))
        out["data_parallel"] = {"size": len(self.replicas), "alive": len(live), "replicas": replicas}
        return out

    def shutdown(self) -> None:
        """Stop every replica (also done when the engine is garbage collected or at exit)."""
        self._shutdown()


def _sum_speculative(stats: list) -> Optional[dict]:
    """Speculative counters summed over replicas (per-position lists element-wise); None without speculation."""
    stats = [s for s in stats if s is not None]
    if not stats:
        return None
    out: dict = {}
    for key in ("rounds", "drafted", "accepted", "committed", "verify_rows"):
        out[key] = sum(s[key] for s in stats)
    for key in ("accepted_per_position", "drafted_per_position"):
        out[key] = [sum(col) for col in zip(*(s[key] for s in stats))]
    chosen: dict = {}
    for s in stats:
        for k, count in s.get("chosen_k", {}).items():
            chosen[k] = chosen.get(k, 0) + count
    out["chosen_k"] = chosen
    return out


def _config_and_tokenizer(model: str, cfg: EngineConfig):
    """The model's config and tokenizer, without loading its weights (the replicas do that)."""
    from ..models import load_model

    config, weights, tokenizer = load_model(model, seed=cfg.seed, device=torch.device("cpu"), dtype=torch.float32,
                                            tokenizer=cfg.tokenizer, revision=cfg.revision,
                                            download_dir=cfg.download_dir)
    getattr(weights, "close", lambda: None)()
    return config, tokenizer


def _start_replicas(model: str, cfg: EngineConfig, devices: list[str], backend: str) -> list[Replica]:
    if backend == "inprocess":
        from .llm_engine import LLMEngine

        return [InProcessReplica(i, LLMEngine(model, EngineConfig.from_kwargs(**dict(_replica_options(cfg, i),
                                                                                  device=device))))
                for i, device in enumerate(devices)]
    if backend == "ray":
        from .ray_replica import start_ray_replicas

        return start_ray_replicas(model, [_replica_options(cfg, i) for i in range(len(devices))], devices[0])
    from .process_replica import ProcessReplica

    context = torch.multiprocessing.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // len(devices))
    replicas = [ProcessReplica(i, model, _replica_options(cfg, i), device, threads, context,
                               step_timeout_s=cfg.step_timeout_s) for i, device in enumerate(devices)]
    try:
        for replica in replicas:  # they load in parallel; wait for each in turn
            replica.wait_ready()
    except BaseException:
        _shutdown_all(replicas)
        raise
    return replicas


def _shutdown_all(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.shutdown()
