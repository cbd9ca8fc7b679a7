"""One engine replica as a data-parallel front end sees it, and the in-process implementation.

A replica takes requests (token ids, SamplingParams), runs them to completion on its own and
hands back RequestOutputs. The front end never reaches inside: it adds, aborts, polls for
outputs, reads stats and shuts the replica down. Implementations: `InProcessReplica` (an
LLMEngine in this process, stepped by `poll`), `ProcessReplica` (process_replica.py: an
LLMEngine in its own process that steps by itself). An actor on another machine fits the same
interface: `wait_handles` lists what `multiprocessing.connection.wait` can block on until the
replica has something to say.

A replica that fails sets `failure` (a sentence naming the replica and the cause) and stops
returning outputs; the front end finishes its requests with an error.
"""

from __future__ import annotations

import abc
from typing import Optional

from ..errors import RequestError
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams

ENGINE_CALLS = ("update_weights", "reset_prefix_cache", "sleep", "wake_up", "is_sleeping", "start_profile",
                "stop_profile")  # LLMEngine methods `Replica.call` runs


class ReplicaEngineCalls:
    """The LLMEngine calls a front end over replicas passes on to every live replica (the
    weights, the prefix cache, sleep mode, profiling). The front end sets `call_targets` (its
    replicas) and `_tracked` (its requests in flight: while any, the calls that need an idle engine
    are refused)."""

    call_targets: list["Replica"]
    _tracked: dict

    def _live(self) -> list["Replica"]:
        return [r for r in self.call_targets if r.alive]

    def _idle(self, what: str) -> None:
        if self._tracked:
            raise RequestError(f"{what} needs an idle engine: finish or abort the running requests first")

    def update_weights(self, weights) -> None:
        """`LLMEngine.update_weights` on every replica (each gets every tensor, on the CPU)."""
        self._idle("update_weights")
        weights = [(name, t.detach().cpu()) for name, t in weights]
        for replica in self._live():
            replica.call("update_weights", weights)

    def reset_prefix_cache(self) -> int:
        """`LLMEngine.reset_prefix_cache` on every replica; the cached blocks dropped in all."""
        return sum(r.call("reset_prefix_cache") for r in self._live())

    def sleep(self, level: int = 1) -> int:
        """`LLMEngine.sleep` on every replica; the bytes given back by all."""
        self._idle("sleep")
        return sum(r.call("sleep", level) for r in self._live())

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """`LLMEngine.wake_up` on every replica."""
        for replica in self._live():
            replica.call("wake_up", tags)

    def is_sleeping(self) -> bool:
        """Whether any replica is asleep."""
        return any(r.call("is_sleeping") for r in self._live())

    def start_profile(self) -> None:
        """`LLMEngine.start_profile` on every replica (each writes into its own subdirectory)."""
        for replica in self._live():
            replica.call("start_profile")

    def stop_profile(self) -> list[str]:
        """`LLMEngine.stop_profile` on every replica: every trace's path."""
        return [path for r in self._live() for path in r.call("stop_profile")]


def call_engine(engine, method: str, *args):
    """`engine.method(*args)` for a method of ENGINE_CALLS (ValueError for any other)."""
    if method not in ENGINE_CALLS:
        raise ValueError(f"method must be one of {ENGINE_CALLS}, got {method!r}")
    return getattr(engine, method)(*args)


class Replica(abc.ABC):
    """The front end's handle on one engine replica.

    `info` (set once the replica is ready): {"model_name", "max_model_len", "depth", "device",
    "workers"} (workers: its engine's worker processes, `Executor.worker_processes()`).
    """

    index: int
    info: dict
    failure: Optional[str] = None

    @property
    def alive(self) -> bool:
        return self.failure is None

    @abc.abstractmethod
    def add_request(self, request_id: str, prompt: dict, params: SamplingParams, *, arrival_time: float,
                    arrival_index: int) -> None:
        """Queue a request; prompt is {"prompt_token_ids": [...], "prompt": text or None}.
        Raises the engine's RequestError/ConfigError when the replica rejects it."""

    @abc.abstractmethod
    def abort_request(self, request_id: str) -> Optional[RequestOutput]:
        """Abort a request; returns its final output, or None if the replica does not hold it."""

    def check_responsive(self, busy: bool) -> None:
        """Fail the replica (set `failure`) if it is hung: busy (it has requests) yet silent past
        the engine's step_timeout_s. Replicas in this process, or whose transport detects that
        itself, need no check."""

    @abc.abstractmethod
    def poll(self, final_only: bool) -> list[RequestOutput]:
        """Outputs available now, without waiting (final_only: only those of finished requests)."""

    def wait_handles(self) -> list:
        """Objects `multiprocessing.connection.wait` can wait on until `poll` has news; empty when
        `poll` itself makes progress (it runs a step)."""
        return []

    @abc.abstractmethod
    def stats(self) -> dict:
        """The replica engine's latest `stats()`."""

    @abc.abstractmethod
    def call(self, method: str, *args):
        """Run the engine method `method` (one of ENGINE_CALLS) on the replica's engine and return
        its result; the engine's errors are raised here."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the replica and free its resources (idempotent)."""

    def describe(self) -> dict:
        """Identity and health for the front end's stats."""
        return {"index": self.index, "device": self.info.get("device"), "workers": self.info.get("workers", []),
                "alive": self.alive, "failure": self.failure}


class InProcessReplica(Replica):
    """An LLMEngine in this process; `poll` runs one engine step when it has work."""

    def __init__(self, index: int, engine):
        self.index = index
        self.engine = engine
        self.info = {"model_name": engine.model_name, "max_model_len": engine.max_model_len, "depth": engine.depth,
                     "device": str(engine.device), "workers": engine.executor.worker_processes()}

    def add_request(self, request_id, prompt, params, *, arrival_time, arrival_index):
        self.engine.add_request(request_id, prompt, params, arrival_time=arrival_time, arrival_index=arrival_index)

    def abort_request(self, request_id):
        return self.engine.abort_request(request_id)

    def poll(self, final_only):
        if not self.alive or not self.engine.has_unfinished_requests():
            return []
        try:
            return self.engine.step(final_only=final_only)
        except Exception as exc:  # noqa: BLE001 - the front end fails this replica's requests, others go on
            self.failure = f"data-parallel replica {self.index} ({self.info['device']}): its engine step failed: {exc!r}"
            return []

    def stats(self):
        return self.engine.stats()

    def call(self, method, *args):
        return call_engine(self.engine, method, *args)

    def shutdown(self):
        self.engine.shutdown()
