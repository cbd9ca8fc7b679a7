"""`ProcessReplica`: an LLMEngine in its own process (torch.multiprocessing, spawn), pinned to one device.

The child builds its engine, then loops: apply the commands waiting on its pipe, run one step if
it has work, send the step's outputs. It steps on its own, so replicas run in parallel while the
front end only routes and collects. Everything on the pipe is plain data (engine/wire.py):

  front end -> child   ("add", seq, request_id, prompt dict, params dict, arrival_time, arrival_index)
                       ("abort", seq, request_id)   ("final_only", bool)   ("stop",)
  child -> front end   ("ready", info)   ("failed", error class name, message)
                       ("reply", seq, result, error or None)
                       ("outputs", [output dicts], stats dict or None)

`add` and `abort` wait for their reply (at most one child step), so admission errors reach the
caller as the engine's own RequestError/ConfigError. The child sends through a writer thread,
so it never blocks on a full pipe while the front end is blocked sending to it. A child that
dies (killed, crashed) closes its pipe: the front end reads EOF and marks the replica failed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from typing import Optional

from .. import errors
from ..config import step_time_limit
from ..outputs import RequestOutput
from .heap import freeze_heap
from .replica import Replica, call_engine
from .wire import output_from_dict, output_to_dict, params_from_dict, params_to_dict

logger = logging.getLogger("rlt")

STATS_INTERVAL_S = 0.05  # the child attaches a stats snapshot at most this often, and whenever it goes idle


class ProcessReplica(Replica):
    """Front-end side of a replica process. Construct, then `wait_ready()`."""

    def __init__(self, index: int, model: str, config: dict, device: str, num_threads: int, context,
                 hooks: Optional["ChildHooks"] = None, step_timeout_s: Optional[float] = None,
                 connection: Optional[tuple] = None):
        """hooks: what the child adds to a plain replica (picklable; default `ChildHooks()`);
        step_timeout_s: how long the child may stay silent while it has requests, or take to answer
        a command, before it is failed as hung (None or inf: no limit); connection: (connection,
        process) of a child started elsewhere that speaks this protocol (no process is started)."""
        hooks = hooks or ChildHooks()
        self.index = index
        self.label = f"data-parallel replica {index}"  # how failures name it
        self.step_timeout_s = step_time_limit(step_timeout_s)
        self._heard = time.monotonic()  # when the child last sent something (or was given work)
        self.info = {"device": device}
        if connection is not None:
            self._conn, self.process = connection
        else:
            self._conn, child = context.Pipe(duplex=True)
            self.process = context.Process(target=replica_main, args=(child, model, config, device, num_threads, hooks),
                                           name=f"rlt-{hooks.name}-{index}", daemon=True)
            self.process.start()
            child.close()
        self._outputs: list[RequestOutput] = []
        self._stats: dict = {}
        self._seq = 0
        self._final_only = False  # what the child's steps return: every advanced request, or finished ones

    @property
    def pid(self) -> Optional[int]:
        return self.process.pid

    def wait_ready(self) -> None:
        """Block until the engine is built; raises the child's error (its class when it is an rlt error)."""
        msg = self._receive()
        if msg is None:
            raise errors.ReplicaError(self.failure)
        if msg[0] == "failed":
            self.shutdown()
            raise _error(msg[1], f"data-parallel replica {self.index} ({self.info['device']}) failed to load: {msg[2]}")
        assert msg[0] == "ready", msg
        self._stats = msg[1].pop("stats")
        self.info.update(msg[1])

    # ---- requests -------------------------------------------------------------------------------------
    def add_request(self, request_id, prompt, params, *, arrival_time, arrival_index):
        self._call("add", request_id, prompt, params_to_dict(params), arrival_time, arrival_index)

    def check_responsive(self, busy: bool) -> None:
        """Fail the replica as hung when it has been silent for step_timeout_s while busy (it has
        requests): a working child sends a stats snapshot at least every STATS_INTERVAL_S."""
        if not busy:
            self._heard = time.monotonic()
        elif (self.alive and self.step_timeout_s is not None and not self._conn_ready()
              and time.monotonic() - self._heard > self.step_timeout_s):
            self._hung(f"sent nothing for {self.step_timeout_s:g} s while it had requests")

    def abort_request(self, request_id):
        out = self._call("abort", request_id)
        return None if out is None else output_from_dict(out)

    def poll(self, final_only):
        if final_only != self._final_only and self.alive:
            self._final_only = final_only
            self._send(("final_only", final_only))
        while self.alive and self._conn_ready():
            self._handle(self._receive())
        outs, self._outputs = self._outputs, []
        return [o for o in outs if o.finished] if final_only else outs

    def wait_handles(self):
        return [self._conn] if self.alive else []

    def stats(self):
        return self._stats

    def call(self, method, *args):
        return self._call("engine", method, *args)

    def shutdown(self):
        if self.process.is_alive():
            try:
                self._conn.send(("stop",))
            except OSError:
                pass
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        self._conn.close()
        if self.failure is None:
            self.failure = f"data-parallel replica {self.index} ({self.info['device']}) was shut down"

    # ---- pipe -----------------------------------------------------------------------------------------
    def _conn_ready(self) -> bool:
        try:
            return self._conn.poll(0)
        except (OSError, EOFError):
            self._died()
            return False

    def _readable(self, timeout: float) -> bool:
        """Whether a message (or the pipe's end, which `_receive` then reports) arrives within timeout."""
        try:
            return self._conn.poll(timeout)
        except (OSError, EOFError):
            return True

    def _call(self, kind: str, *args):
        """Send a command and wait for its reply, keeping the outputs that arrive meanwhile."""
        if not self.alive:
            raise errors.ReplicaError(self.failure)
        self._seq += 1
        seq = self._seq
        if not self._send((kind, seq, *args)):
            raise errors.ReplicaError(self.failure)
        deadline = None if self.step_timeout_s is None else time.monotonic() + self.step_timeout_s
        while True:
            if deadline is not None and not self._readable(max(deadline - time.monotonic(), 0.0)):
                self._hung(f"did not answer {kind!r} within {self.step_timeout_s:g} s")
                raise errors.ReplicaError(self.failure)
            msg = self._receive()
            if msg is None:
                raise errors.ReplicaError(self.failure)
            if msg[0] == "reply" and msg[1] == seq:
                _, _, result, error = msg
                if error is not None:
                    raise _error(*error)
                return result
            self._handle(msg)

    def _send(self, msg: tuple) -> bool:
        try:
            self._conn.send(msg)
            return True
        except OSError:
            self._died()
            return False

    def _receive(self):
        """The next message, or None when the child is gone (the replica is then failed)."""
        try:
            msg = self._conn.recv()
        except (EOFError, OSError):
            self._died()
            return None
        self._heard = time.monotonic()
        return msg

    def _hung(self, what: str) -> None:
        """Fail the replica as hung (step_timeout_s) and stop its process."""
        self.failure = (f"{self.label} ({self.info['device']}, pid {self.process.pid}) {what} (step_timeout_s): "
                        "hung, stopped")
        self.process.kill()
        self.process.join(5)

    def _handle(self, msg) -> None:
        if msg is None:
            return
        if msg[0] == "outputs":
            self._outputs.extend(output_from_dict(d) for d in msg[1])
            if msg[2] is not None:
                self._stats = msg[2]
        elif msg[0] == "failed":
            self.failure = f"data-parallel replica {self.index} ({self.info['device']}) failed: {msg[2]}"

    def _died(self) -> None:
        if self.failure is not None:
            return
        self.process.join(1)
        code = self.process.exitcode
        how = "is unreachable: its connection broke" if code is None else (
            f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")
        pid = self.info.get("pid") or self.process.pid
        self.failure = f"data-parallel replica {self.index} ({self.info['device']}, pid {pid}) {how}"


def _error(class_name: str, message: str) -> Exception:
    """The rlt error class `class_name` (RequestError, ConfigError, ...) with `message`, else ReplicaError."""
    cls = getattr(errors, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.RltError)):
        cls = errors.ReplicaError
    return cls(message)


# ---- child process ------------------------------------------------------------------------------------

class ChildHooks:
    """What a child process adds to a plain replica around its engine and its serve loop (nothing
    here; disaggregated prefill's roles add a transfer group, handoffs and imports). Picklable:
    the front end builds it and the child calls it."""

    name = "replica"

    def before_engine(self, device: str) -> None:
        """Runs before the engine is built."""

    def engine_built(self, engine) -> None:
        """Runs once the engine is built."""

    def final_only(self, asked: bool) -> bool:
        """Whether the engine's steps return finished requests only, given what the front end asked."""
        return asked

    def idle_wait(self) -> Optional[float]:
        """How long an idle child waits for a command before looking again (None: until one comes)."""
        return None

    def command(self, engine, cmd: tuple, outbox: queue.SimpleQueue) -> bool:
        """Apply a command the plain protocol lacks; False when `cmd` is not one of them."""
        return False

    def after_step(self, engine, outbox: queue.SimpleQueue) -> None:
        """Runs after each step (or each pass with no work)."""

    def close(self) -> None:
        """Runs when the child stops normally."""

def replica_main(conn, model: str, config: dict, device: str, num_threads: int, hooks: ChildHooks) -> None:
    """Entry point of a replica process: build the engine on `device`, then serve the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front end decides when replicas stop
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    writer = threading.Thread(target=_write, args=(conn, outbox), name=f"rlt-{hooks.name}-writer", daemon=True)
    writer.start()
    try:
        import torch

        from ..config import EngineConfig
        from .llm_engine import LLMEngine

        torch.set_num_threads(num_threads)
        # The front end still stops this process at its exit, but its engine may start processes of
        # its own (tensor-parallel ranks, daemons of this one), which a daemonic process may not.
        multiprocessing.current_process().daemon = False
        hooks.before_engine(device)
        engine = LLMEngine(model, EngineConfig.from_kwargs(**dict(config, device=device)))
        freeze_heap()
        hooks.engine_built(engine)
    except Exception as exc:  # noqa: BLE001 - reported to the front end, which raises it
        outbox.put(("failed", type(exc).__name__, str(exc) if isinstance(exc, errors.RltError) else repr(exc)))
        _finish(outbox, writer)
        return
    outbox.put(("ready", {"model_name": engine.model_name, "max_model_len": engine.max_model_len,
                          "depth": engine.depth, "device": str(engine.device), "pid": os.getpid(),
                          "workers": engine.executor.worker_processes(), "stats": engine.stats()}))
    try:
        _serve(conn, engine, outbox, hooks)
    except Exception as exc:  # noqa: BLE001 - an engine (or hook) failure: report it and end this child
        outbox.put(("failed", type(exc).__name__, f"{exc!r}\n{traceback.format_exc()}"))
        engine.executor.shutdown(wait=False)  # ranks still alive (os._exit skips their cleanup)
        _finish(outbox, writer)
        os._exit(1)
    engine.shutdown()
    _finish(outbox, writer)
    hooks.close()


def _serve(conn, engine, outbox: queue.SimpleQueue, hooks: ChildHooks) -> None:
    last_stats = 0.0
    final_only = hooks.final_only(False)
    while True:
        if not engine.has_unfinished_requests():
            try:
                conn.poll(hooks.idle_wait())  # idle: sleep until a command (or the front end's exit: EOF)
            except (EOFError, OSError):
                return
        while True:
            try:
                if not conn.poll(0):
                    break
                cmd = conn.recv()
            except (EOFError, OSError):
                return  # the front end is gone
            if cmd[0] == "stop":
                return
            if cmd[0] == "final_only":
                final_only = hooks.final_only(cmd[1])
                continue
            if not hooks.command(engine, cmd, outbox):
                outbox.put(_apply(engine, cmd))
        outs = []
        if engine.has_unfinished_requests():
            outs = engine.step(final_only=final_only)
        hooks.after_step(engine, outbox)
        now = time.monotonic()
        idle = not engine.has_unfinished_requests()
        stats = None
        if now - last_stats >= STATS_INTERVAL_S or idle:
            stats, last_stats = engine.stats(), now
        if outs or stats is not None:
            outbox.put(("outputs", [output_to_dict(o) for o in outs], stats))


def _apply(engine, cmd: tuple) -> tuple:
    kind, seq = cmd[0], cmd[1]
    try:
        if kind == "add":
            request_id, prompt, params, arrival_time, arrival_index = cmd[2:]
            engine.add_request(request_id, prompt, params_from_dict(params), arrival_time=arrival_time,
                               arrival_index=arrival_index)
            return ("reply", seq, None, None)
        if kind == "abort":
            out = engine.abort_request(cmd[2])
            return ("reply", seq, None if out is None else output_to_dict(out), None)
        if kind == "engine":
            return ("reply", seq, call_engine(engine, *cmd[2:]), None)
        raise ValueError(f"unknown replica command {kind!r}")
    except errors.RltError as exc:
        return ("reply", seq, None, (type(exc).__name__, str(exc)))


def _write(conn, outbox: queue.SimpleQueue) -> None:
    while True:
        msg = outbox.get()
        if msg is None:
            return
        try:
            conn.send(msg)
        except OSError:
            return


def _finish(outbox: queue.SimpleQueue, writer: threading.Thread) -> None:
    outbox.put(None)
    writer.join(10)
