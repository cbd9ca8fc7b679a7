"""`RayReplica`: an LLMEngine in a Ray actor, placed by Ray on any node of a cluster.

`distributed_executor="ray"` makes the data-parallel front end start its replicas as Ray actors
instead of local processes: each asks Ray for tensor_parallel_size GPUs (`num_gpus=T`, so Ray
puts a replica's whole tensor-parallel group on one node; the actor's CUDA_VISIBLE_DEVICES is set
to the GPUs Ray assigned it, so its engine and its ranks see them as cuda:0..T-1) or, for CPU
replicas, an equal share of the cluster's CPUs (at least T). With T > 1 the actor's engine builds
the multiprocess tensor-parallel executor as a replica process does: its ranks are child
processes of the actor, on its node. Ray is joined with `ray.init()` when this process is not
connected yet: the cluster at $RAY_ADDRESS, else the one started last on this host (`ray start`),
else a new local one.

The actor (`EngineActor`) steps its engine on a thread of its own, like a replica process does;
Ray runs its methods on other threads (a threaded actor), so commands and the output long-poll
never wait for each other beyond one engine step. Everything passed in and out is plain data
(engine/wire.py):

  front end -> actor   load(model, options, device, threads) -> ("ready", info) | ("failed", class, message)
                       add(request_id, prompt, params dict, arrival_time, arrival_index) -> error or None
                       abort(request_id) -> (output dict or None, error or None)
                       set_final_only(bool)   next_outputs(timeout) -> ([output dicts], stats or None, failure)

On the front end a reader thread long-polls `next_outputs` and wakes the front end through a
local pipe (`wait_handles`). An actor that dies (killed, its node lost, its process crashed)
fails that call with a Ray actor error: the replica is then failed with a message naming it, its
node and Ray's cause, and the front end ends its requests with an error. A step that fails (a
tensor-parallel rank that died, say) fails the replica the same way; its actor stops its ranks
and is killed, so its GPUs or CPUs go back to the cluster. An actor that answers no call for the
engine's step_timeout_s (hung: the long-poll returns at least every POLL_S otherwise) is failed
and killed too.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from typing import Optional

from .. import errors
from ..config import EngineConfig, step_time_limit
from ..outputs import RequestOutput
from .process_replica import STATS_INTERVAL_S, _error
from .replica import Replica, call_engine
from .wire import output_from_dict, output_to_dict, params_from_dict, params_to_dict

logger = logging.getLogger("rlt")

POLL_S = 1.0  # longest one output long-poll waits in the actor (so the reader notices shutdown)
ACTOR_THREADS = 4  # concurrent method calls an actor serves (long-poll, add/abort, final_only)
PLACEMENT_WARN_S = 60.0  # log once when Ray has not placed a replica's actor after this long
STOP_S = 30.0  # longest shutdown waits for an actor to stop its engine's ranks before killing it


def import_ray():
    """The `ray` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise errors.ConfigError("distributed_executor='ray' needs Ray, which is not installed: pip install "
                                 "'rlt[ray]' (or ray[data]>=2.40), or use distributed_executor='mp'") from exc
    return ray


def connect_ray():
    """The `ray` module, connected: `ray.init()` unless this process already is ($RAY_ADDRESS, else
    the cluster started last on this host, else a new local one)."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    return ray


def placement(device: str, replicas: int, ranks: int, ray) -> tuple[str, dict, int]:
    """(engine device inside each actor, Ray resources of each actor, torch threads) for `replicas`
    actors of `ranks` tensor-parallel ranks each on the connected cluster. Every actor runs on one
    node. device 'cuda'/'auto' with GPUs in the cluster: `ranks` GPUs each; 'cpu', or 'auto'
    without GPUs: an equal share of the cluster's CPUs, at least `ranks` (fewer where the nodes
    could not hold the larger share). ConfigError when the nodes cannot hold every actor."""
    if device.startswith("cuda:"):
        raise errors.ConfigError(f"device={device!r} names one GPU, but with distributed_executor='ray' Ray assigns "
                                 "each replica its GPUs; use device='cuda' or 'auto' (or 'cpu')")
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    sizes = f"data_parallel_size ({replicas}) x tensor_parallel_size ({ranks})"
    if device == "cpu" or (device == "auto" and gpus == 0):
        per_node = [int(node.get("CPU", 0)) for node in nodes]
        for share in range(cpus // replicas, ranks - 1, -1):
            if sum(n // share for n in per_node) >= replicas:
                return "cpu", {"num_cpus": share}, share
        raise errors.ConfigError(f"{sizes} needs {replicas} CPU replicas of {ranks} CPUs each, each on one node; the "
                                 f"Ray cluster has {cpus} CPUs (per node: {per_node}); lower data_parallel_size or "
                                 "tensor_parallel_size, or add nodes")
    per_node = [int(node.get("GPU", 0)) for node in nodes]
    if sum(n // ranks for n in per_node) < replicas:
        raise errors.ConfigError(f"{sizes} needs {replicas} replicas of {ranks} GPUs each, each on one node "
                                 f"({replicas * ranks} GPUs in all); the Ray cluster has {gpus} GPUs (per node: "
                                 f"{per_node}) with device={device!r}; lower data_parallel_size or "
                                 "tensor_parallel_size, add GPU nodes or set device='cpu'")
    return "cuda", {"num_gpus": ranks}, 0


def actor_gpus(gpu_ids: list, ranks: int) -> str:
    """The CUDA_VISIBLE_DEVICES of a replica actor on CUDA: the `ranks` GPUs Ray assigned it
    (`ray.get_gpu_ids()`), which its engine and its ranks (child processes, which inherit it) see
    as cuda:0..ranks-1. ConfigError unless Ray assigned exactly `ranks` GPUs."""
    if len(gpu_ids) != ranks:
        raise errors.ConfigError(f"tensor_parallel_size={ranks} needs {ranks} GPUs in its Ray actor, but Ray assigned "
                                 f"it {len(gpu_ids)} ({[str(g) for g in gpu_ids]})")
    return ",".join(str(g) for g in gpu_ids)


class EngineActor:
    """Body of a replica's Ray actor: one LLMEngine, stepped by a thread of its own."""

    def __init__(self):
        self._engine = None
        self._engine_lock = threading.Lock()  # held by each engine step and each command
        lock = threading.Lock()
        self._work = threading.Condition(lock)  # the stepping thread waits here for requests
        self._news = threading.Condition(lock)  # next_outputs waits here for outputs
        self._pending = False  # the engine has requests (set under _engine_lock, read under lock)
        self._final_only = False
        self._stopped = False
        self._outbox: list[dict] = []
        self._stats: Optional[dict] = None
        self._failure: Optional[str] = None

    def load(self, model: str, options: dict, device: str, num_threads: int) -> tuple:
        """Build the engine and start stepping; ("ready", info) or ("failed", error class, message)."""
        try:
            import ray
            import torch

            from .llm_engine import LLMEngine

            if num_threads:  # Ray's CPUs are logical: never more threads than the node has cores
                torch.set_num_threads(min(num_threads, os.cpu_count() or num_threads))
            if device == "cuda":  # before CUDA starts here, and before the ranks are spawned
                os.environ["CUDA_VISIBLE_DEVICES"] = actor_gpus(ray.get_gpu_ids(), options["tensor_parallel_size"])
            engine = LLMEngine(model, EngineConfig.from_kwargs(**dict(options, device=device)))
        except Exception as exc:  # noqa: BLE001 - reported to the front end, which raises it
            return ("failed", type(exc).__name__, str(exc) if isinstance(exc, errors.RltError) else repr(exc))
        self._engine = engine
        context = ray.get_runtime_context()
        threading.Thread(target=self._run, name="rlt-ray-replica-step", daemon=True).start()
        return ("ready", {"model_name": engine.model_name, "max_model_len": engine.max_model_len,
                          "depth": engine.depth, "device": str(engine.device), "node": ray.util.get_node_ip_address(),
                          "node_id": context.get_node_id(), "actor_id": context.get_actor_id(),
                          "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid(),
                          "workers": engine.executor.worker_processes(), "stats": engine.stats()})

    def add(self, request_id: str, prompt: dict, params: dict, arrival_time: float, arrival_index: int):
        """Queue a request; returns None, or (error class, message) when the engine rejects it."""
        with self._engine_lock:
            try:
                self._engine.add_request(request_id, prompt, params_from_dict(params), arrival_time=arrival_time,
                                         arrival_index=arrival_index)
            except errors.RltError as exc:
                return (type(exc).__name__, str(exc))
            with self._work:
                self._pending = True
                self._work.notify()
        return None

    def abort(self, request_id: str) -> tuple:
        """(final output dict or None, None), or (None, (error class, message))."""
        with self._engine_lock:
            try:
                out = self._engine.abort_request(request_id)
            except errors.RltError as exc:
                return None, (type(exc).__name__, str(exc))
        return (None if out is None else output_to_dict(out)), None

    def call(self, method: str, args: tuple) -> tuple:
        """(the engine method's result, None), or (None, (error class, message)); method: one of ENGINE_CALLS."""
        with self._engine_lock:
            try:
                return call_engine(self._engine, method, *args), None
            except (errors.RltError, ValueError) as exc:  # (ValueError: a method not in ENGINE_CALLS)
                return None, (type(exc).__name__, str(exc))

    def set_final_only(self, value: bool) -> None:
        self._final_only = bool(value)

    def next_outputs(self, timeout: float) -> tuple:
        """Outputs and the latest stats since the last call, waiting up to `timeout` seconds for
        some; (output dicts, stats dict or None, failure message or None)."""
        with self._news:
            self._news.wait_for(lambda: self._outbox or self._stats is not None or self._failure, timeout)
            outs, self._outbox = self._outbox, []
            stats, self._stats = self._stats, None
            return outs, stats, self._failure

    def stop(self) -> None:
        """End the stepping thread, then stop the engine's tensor-parallel ranks."""
        with self._work:
            self._stopped = True
            self._work.notify()
        with self._engine_lock:
            if self._engine is not None:
                self._engine.shutdown()

    def _run(self) -> None:
        """Step while there are requests; publish each step's outputs and, at most every
        STATS_INTERVAL_S and whenever the engine goes idle, its stats."""
        last_stats = 0.0
        while True:
            with self._work:
                self._work.wait_for(lambda: self._pending or self._stopped)
                if self._stopped:
                    return
            with self._engine_lock:
                if self._stopped:  # stop() came while this thread waited for the lock
                    return
                try:
                    outs = (self._engine.step(final_only=self._final_only)
                            if self._engine.has_unfinished_requests() else [])  # an abort may have emptied it
                    idle = not self._engine.has_unfinished_requests()
                    now = time.monotonic()
                    stats = None
                    if idle or now - last_stats >= STATS_INTERVAL_S:
                        stats, last_stats = self._engine.stats(), now
                    outs = [output_to_dict(o) for o in outs]
                except Exception as exc:  # noqa: BLE001 - an engine failure ends this replica; others go on
                    self._engine.executor.shutdown(wait=False)  # ranks still alive (one may be stuck in a collective)
                    with self._news:
                        self._failure = f"its engine step failed: {exc!r}"
                        self._news.notify_all()
                    return
                with self._work:
                    self._pending = not idle
            if outs or stats is not None:
                with self._news:
                    self._outbox.extend(outs)
                    if stats is not None:
                        self._stats = stats
                    self._news.notify_all()


class RayReplica(Replica):
    """Front-end side of a replica actor. Construct (the actor starts loading), then `wait_ready()`."""

    def __init__(self, index: int, model: str, options: dict, device: str, num_threads: int, resources: dict):
        self._ray = import_ray()
        self.index = index
        self.info = {"device": device}
        actor_class = self._ray.remote(EngineActor)
        self.actor = actor_class.options(max_concurrency=ACTOR_THREADS, **resources).remote()
        self._resources = resources
        self._loading = self.actor.load.remote(model, options, device, num_threads)
        self._lock = threading.Lock()
        self._outputs: list[RequestOutput] = []
        self._stats: dict = {}
        self._death: Optional[str] = None  # set by the reader; becomes `failure` once its outputs are polled
        self._signalled = False
        self._wake_recv, self._wake_send = multiprocessing.Pipe(duplex=False)
        self._closing = False
        self._final_only = False
        self._reader: Optional[threading.Thread] = None
        self.step_timeout_s = step_time_limit(options.get("step_timeout_s"))
        self._heard = time.monotonic()  # when an actor call last returned (the long-poll: at least every POLL_S)

    def _name(self) -> str:
        where = self.info["device"]
        if self.info.get("node"):
            where += f" on node {self.info['node']}, Ray actor {self.info['actor_id']}"
        return f"data-parallel replica {self.index} ({where})"

    def wait_ready(self) -> None:
        """Block until the actor's engine is built; raises its error (its class when it is an rlt error)."""
        ready, _ = self._ray.wait([self._loading], timeout=PLACEMENT_WARN_S)
        if not ready:
            logger.warning("%s: not loaded after %.0f s; it needs %s and the cluster has %s available", self._name(),
                           PLACEMENT_WARN_S, self._resources, self._ray.available_resources())
        try:
            msg = self._ray.get(self._loading)
        except self._ray.exceptions.RayError as exc:
            self.failure = f"{self._name()} died while loading: {_cause(exc)}"
            self.shutdown()
            raise errors.ReplicaError(self.failure) from exc
        if msg[0] == "failed":
            self.shutdown()
            raise _error(msg[1], f"data-parallel replica {self.index} ({self.info['device']}) failed to load: {msg[2]}")
        self._stats = msg[1].pop("stats")
        self.info.update(msg[1])
        self._reader = threading.Thread(target=self._read, name=f"rlt-ray-replica-{self.index}", daemon=True)
        self._reader.start()

    # ---- requests -------------------------------------------------------------------------------------
    def add_request(self, request_id, prompt, params, *, arrival_time, arrival_index):
        error = self._call(self.actor.add, request_id, prompt, params_to_dict(params), arrival_time, arrival_index)
        if error is not None:
            raise _error(*error)

    def abort_request(self, request_id):
        out, error = self._call(self.actor.abort, request_id)
        if error is not None:
            raise _error(*error)
        return None if out is None else output_from_dict(out)

    def check_responsive(self, busy: bool) -> None:
        """Fail the replica as hung when its actor has answered no call for step_timeout_s (its
        output long-poll returns at least every POLL_S, busy or not), and kill the actor."""
        if (self.alive and self._death is None and self.step_timeout_s is not None
                and time.monotonic() - self._heard > self.step_timeout_s):
            self._hung(f"answered nothing for {self.step_timeout_s:g} s")

    def poll(self, final_only):
        if final_only != self._final_only and self.alive:
            self._final_only = final_only
            self.actor.set_final_only.remote(final_only)  # until it lands, extra outputs are filtered here
        with self._lock:
            while self._wake_recv.poll(0):
                self._wake_recv.recv_bytes()
            self._signalled = False
            outs, self._outputs = self._outputs, []
            if self._death is not None and self.failure is None:
                self.failure = self._death
        return [o for o in outs if o.finished] if final_only else outs

    def wait_handles(self):
        return [self._wake_recv] if self.alive else []

    def stats(self):
        return self._stats

    def call(self, method, *args):
        result, error = self._call(self.actor.call, method, args)
        if error is not None:
            raise _error(*error)
        return result

    def describe(self) -> dict:
        return dict(super().describe(), node=self.info.get("node"), actor_id=self.info.get("actor_id"))

    def shutdown(self):
        if self._closing:
            return
        self._closing = True
        self._stop_actor()
        if self._reader is not None:
            self._reader.join(POLL_S + 5)
        self._wake_recv.close()
        self._wake_send.close()
        if self.failure is None:
            self.failure = f"data-parallel replica {self.index} ({self.info['device']}) was shut down"

    # ---- actor calls ----------------------------------------------------------------------------------
    def _call(self, method, *args):
        """Call an actor method and wait for its result; ReplicaError when the actor is gone."""
        if not self.alive:
            raise errors.ReplicaError(self.failure)
        try:
            result = self._ray.get(method.remote(*args), timeout=self.step_timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            self._hung(f"did not answer {method._method_name!r} within {self.step_timeout_s:g} s")
            raise errors.ReplicaError(self.failure) from None
        except self._ray.exceptions.RayError as exc:
            self._died(exc)
            self.failure = self._death
            raise errors.ReplicaError(self.failure) from exc
        self._heard = time.monotonic()
        return result

    def _hung(self, what: str) -> None:
        """Fail the replica as hung (step_timeout_s) and kill its actor."""
        self.failure = f"{self._name()} {what} (step_timeout_s): hung, stopped"
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or Ray shut down first
            pass

    def _read(self) -> None:
        """Reader thread: long-poll the actor's outputs and wake the front end when some arrive."""
        while not self._closing:
            try:
                outs, stats, failure = self._ray.get(self.actor.next_outputs.remote(POLL_S))
            except Exception as exc:  # noqa: BLE001 - a Ray actor error (or Ray shut down under us)
                if not self._closing:
                    self._died(exc)
                    self._wake()
                return
            self._heard = time.monotonic()
            rebuilt = [output_from_dict(d) for d in outs]
            with self._lock:
                self._outputs.extend(rebuilt)
                if stats is not None:
                    self._stats = stats
                if failure is not None and self._death is None:
                    self._death = f"{self._name()} failed: {failure}"
            if rebuilt or failure is not None:
                self._wake()
            if failure is not None:
                self._stop_actor()  # its ranks and its GPUs or CPUs go back, as a failed replica process exits
                return

    def _stop_actor(self) -> None:
        """Ask the actor to stop its engine (and so its tensor-parallel ranks), waiting up to
        STOP_S, then kill it."""
        try:
            self._ray.get(self.actor.stop.remote(), timeout=STOP_S)
        except Exception:  # noqa: BLE001 - dead, stuck past STOP_S, or Ray shut down first: killed below
            pass
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone, or Ray shut down first
            pass

    def _died(self, exc: BaseException) -> None:
        """Record why the actor can no longer serve: it died (a Ray actor error), or one of its
        calls raised something that is not an rlt error (an engine bug, reported like a step failure)."""
        how = "died" if isinstance(exc, self._ray.exceptions.RayActorError) else "failed"
        with self._lock:
            if self._death is None:
                self._death = f"{self._name()} {how}: {_cause(exc)}"

    def _wake(self) -> None:
        with self._lock:
            if self._signalled or self._closing:
                return
            self._signalled = True
            try:
                self._wake_send.send_bytes(b"")
            except OSError:
                pass


def _cause(exc: BaseException) -> str:
    """Ray's reason for an actor error, on one line."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text if len(text) <= 600 else text[:600] + "..."


def ray_replica_devices(cfg: EngineConfig) -> list[str]:
    """The engine device of each replica actor ('cuda' or 'cpu'), after connecting to Ray and checking
    that the cluster has the GPUs or CPUs (ConfigError when Ray is missing or the cluster too small)."""
    device, _, _ = placement(cfg.device, cfg.data_parallel_size, cfg.tensor_parallel_size, connect_ray())
    return [device] * cfg.data_parallel_size


def start_ray_replicas(model: str, options: list[dict], device: str) -> list[RayReplica]:
    """One RayReplica per entry of `options` (each replica's engine options), placed by Ray and
    loaded in parallel; raises the first load error after stopping the others."""
    ray = connect_ray()
    engine_device, resources, threads = placement(device, len(options), options[0]["tensor_parallel_size"], ray)
    replicas = []
    try:
        for i, opts in enumerate(options):
            replicas.append(RayReplica(i, model, dict(opts, distributed_executor="mp"), engine_device, threads,
                                       resources))
        for replica in replicas:
            replica.wait_ready()
            logger.info("data-parallel replica %d: Ray actor %s on node %s, device %s, GPUs %s", replica.index,
                        replica.info["actor_id"], replica.info["node"], replica.info["device"],
                        replica.info["gpu_ids"] or "none")
    except BaseException:
        for replica in replicas:
            replica.shutdown()
        raise
    return replicas
