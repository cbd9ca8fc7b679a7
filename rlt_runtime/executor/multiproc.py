"""MultiprocExecutor: a tensor-parallel group, one worker process per rank.

Ranks are started with torch.multiprocessing (spawn) and join one torch.distributed group (NCCL
on CUDA, rank r on cuda:(k+r) for an engine on cuda:k; gloo on CPU). They meet at a rendezvous
store the executor itself hosts on 127.0.0.1, on a port the OS hands it and it keeps until
shutdown, so groups started side by side (data-parallel replicas of a tensor-parallel engine)
never share one. Each builds a
`Worker` holding its shard of the model (models/tensor_parallel.py) and its share of every KV
plane. Every call — a step's plain `StepInput` included — is sent to every rank over its pipe
(the broadcast), and every rank runs it: the same step programs, the same collectives, the same
sampling (identical seeds and, after each sum, identical bits), so all ranks stay in lockstep.
Rank 0 sends the step's results back; the other ranks answer with None (or their error).
A step whose round checks guided drafts is two calls: "execute" is answered (by rank 0) with the
drafted tokens, in the middle of the step; the engine's masks come back as the call
"verify_masks", which the ranks read inside the step and answer with the step's results. A decode
step whose guided rows take their masks late is two calls too: "execute" is answered (with None)
once each rank has submitted the forward; the engine builds the masks meanwhile and sends them as
the call "late_masks", which the ranks read before sampling and answer with the step's results.
One reader thread per rank empties its pipe as replies arrive; replies are matched to calls in
the order the calls were sent, so steps may overlap (async scheduling).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import queue
import threading
import time
import traceback
from typing import Optional

import torch
import torch.distributed as dist

from ..cache.memory import MemoryPlan
from ..config import step_time_limit
from ..errors import ConfigError
from ..step import StepInput, StepOutput
from .executor import Executor
from .worker import Worker, WorkerSpec


RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=5)


def rank_device(device: str, rank: int) -> str:
    """The device of `rank` in a group whose engine runs on `device`: cuda:(k+rank) for cuda:k
    (cuda:0 for plain 'cuda'), else the CPU."""
    dev = torch.device(device)
    return f"cuda:{(dev.index or 0) + rank}" if dev.type == "cuda" else "cpu"


def _rank_main(rank: int, size: int, spec: WorkerSpec, store_port: int, num_threads: int, conn) -> None:
    """A rank's process: join the group, load the shard, then serve calls until None arrives."""
    from ..models.tensor_parallel import TensorParallel

    try:
        device = rank_device(spec.device, rank)
        on_cuda = device != "cpu"
        if on_cuda:
            torch.cuda.set_device(device)
        torch.set_num_threads(num_threads)
        store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
        dist.init_process_group("nccl" if on_cuda else "gloo", store=store, rank=rank, world_size=size)
        spec = dataclasses.replace(spec, device=device, tp_rank=rank, tp_size=size)
        worker = Worker(spec, TensorParallel(rank, size))
        worker.load()
    except BaseException as exc:  # noqa: BLE001 - reported to the engine, which raises it
        conn.send(("error", _describe(exc)))
        return
    conn.send(("ok", None))
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            method, args = msg
            try:
                if method == "execute":
                    step, mode = args
                    taken = []

                    def guide(drafted):  # reply with the drafts, wait for the masks (the "verify_masks" call)
                        conn.send(("ok", drafted if rank == 0 else None))
                        _, (masks,) = conn.recv()
                        return masks

                    def late_masks():  # the forward is submitted: reply, wait for the masks (the "late_masks" call)
                        conn.send(("ok", None))
                        _, (slots, masks) = conn.recv()
                        taken.append(True)
                        return slots, masks

                    handle = worker.execute(step, guide if mode == "guided" else None,
                                            late_masks if mode == "late" else None)
                    if mode == "late" and not taken:  # keep the pipe in step, then fail the step
                        late_masks()
                        raise RuntimeError("the step never asked for its late masks")
                    out = None
                    result = handle.result()
                    if rank == 0:
                        out = StepOutput(rows=handle.rows, prefills=handle.prefills, prompt_rows=handle.prompt_rows,
                                         round_k=handle.round_k, result=result, device_ms=handle.device_ms())
                elif method == "export_swapped":  # host copies leave through shared memory, which pinned pages cannot join
                    out = [[t.clone() if t.is_pinned() else t for t in copies] for copies in worker.export_swapped(*args)]
                else:
                    out = getattr(worker, method)(*args)
                conn.send(("ok", out))
            except Exception as exc:  # noqa: BLE001
                conn.send(("error", _describe(exc)))
    finally:
        dist.destroy_process_group()


def _describe(exc: BaseException) -> tuple:
    return (type(exc).__name__, str(exc), traceback.format_exc())


def _gone(proc) -> str:
    """How a rank's process ended, as a sentence tail."""
    proc.join(timeout=5)
    code = proc.exitcode
    return ("is still running but its pipe broke" if code is None else
            f"was killed by signal {-code}" if code < 0 else f"exited with status {code}")


class RemoteStep:
    """The engine's handle on a step running on the group; fields filled by result()."""

    def __init__(self, executor: "MultiprocExecutor", seq: int):
        self._executor, self._seq = executor, seq
        self._out: Optional[StepOutput] = None
        self.rows, self.prefills, self.prompt_rows, self.round_k = [], [], [], 0
        self.guided = False

    def result(self):
        if self._out is None:
            self._out = self._executor._wait(self._seq, self._executor.step_timeout_s)[0]
            o = self._out
            self.rows, self.prefills, self.prompt_rows, self.round_k = o.rows, o.prefills, o.prompt_rows, o.round_k
        return self._out.result

    def device_ms(self) -> Optional[float]:
        return self._out.device_ms if self._out is not None else None


class MultiprocExecutor(Executor):
    """One worker process per tensor-parallel rank. step_timeout_s: how long a step (or a
    speculative round's drafts) may take before the ranks that have not answered are reported as
    hung (RuntimeError; None or inf: no limit). Loading, profiling and capture calls have no limit."""

    def __init__(self, spec: WorkerSpec, size: int, step_timeout_s: Optional[float] = None):
        from ..models.tensor_parallel import check_tensor_parallel

        check_tensor_parallel(spec.model_config, size)
        self.devices = [rank_device(spec.device, rank) for rank in range(size)]
        if self.devices[0] != "cpu":
            visible = torch.cuda.device_count()
            if int(self.devices[-1].split(":")[1]) >= visible:
                raise ConfigError(f"tensor_parallel_size={size} on {spec.device} needs {self.devices[0]}.."
                                  f"{self.devices[-1]} but {visible} GPUs are visible (CUDA_VISIBLE_DEVICES is honoured)")
        self.size, self.step_timeout_s = size, step_time_limit(step_timeout_s)
        self._failure: Optional[str] = None  # set when the group hung: every later call raises it
        self._sent = self._received = 0
        self._replies: dict[int, list] = {}
        self._unread: set[int] = set()  # calls whose replies are dropped (an "execute" taking late masks)
        ctx = torch.multiprocessing.get_context("spawn")
        # The group's rendezvous: held here (port 0: the OS picks a free one) until shutdown.
        self._store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=RENDEZVOUS_TIMEOUT)
        threads = max(1, torch.get_num_threads() // size)  # this process's share, split over its ranks
        self._conns, self._procs = [], []
        for rank in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(rank, size, spec, self._store.port, threads, child),
                               daemon=True, name=f"rlt-tp-rank{rank}")
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # (rank, reply) in arrival order
        self._pending = [collections.deque() for _ in range(size)]  # replies read, per rank, in call order
        for rank, (conn, proc) in enumerate(zip(self._conns, self._procs)):
            threading.Thread(target=self._read, args=(rank, conn, proc), daemon=True, name=f"rlt-tp-read{rank}").start()
        try:
            self._collect("load")
        except BaseException:
            self.shutdown(wait=False)
            raise

    # ---- calls -----------------------------------------------------------------------------------
    def _send(self, method: str, *args) -> int:
        return self._send_each(method, [args] * self.size)

    def _send_each(self, method: str, per_rank: list) -> int:
        """One call with arguments of its own for each rank (per_rank[r]: rank r's tuple)."""
        if self._failure is not None:  # replies of a hung group can no longer be matched to calls
            raise RuntimeError(self._failure)
        for rank, (conn, proc, args) in enumerate(zip(self._conns, self._procs, per_rank)):
            try:
                conn.send((method, args))
            except OSError as exc:
                raise RuntimeError(f"tensor-parallel rank {rank} (pid {proc.pid}) {_gone(proc)}") from exc
        seq, self._sent = self._sent, self._sent + 1
        return seq

    def _read(self, rank: int, conn, proc) -> None:
        """Reader thread of one rank's pipe: every reply goes to the inbox as it arrives, so a rank
        never blocks on a full pipe while the engine is sending it the next step."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("error", ("EOFError", f"its process (pid {proc.pid}) {_gone(proc)}", ""))
                self._inbox.put((rank, msg))
                return
            self._inbox.put((rank, msg))

    def _collect(self, what: str, timeout: Optional[float] = None) -> list:
        """The next reply of every rank. The first error (or a rank that exits) is raised at once —
        a ConfigError as itself — without waiting for ranks that may be stuck in a collective; so is
        a RuntimeError naming the ranks still silent after `timeout` seconds (None: wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not all(self._pending):
            try:
                rank, (status, value) = self._inbox.get(
                    timeout=None if deadline is None else max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                silent = [f"rank {r} (pid {p.pid}, {'alive' if p.is_alive() else 'exited'})"
                          for r, (p, replies) in enumerate(zip(self._procs, self._pending)) if not replies]
                self._failure = (f"tensor-parallel {', '.join(silent)} sent no reply to {what} within "
                                 f"{timeout:g} s (step_timeout_s): hung")
                raise RuntimeError(self._failure) from None
            if status == "error":
                name, message, tb = value
                if name == "ConfigError":
                    raise ConfigError(message)
                raise RuntimeError(f"tensor-parallel rank {rank} failed in {what}: {name}: {message}\n{tb}")
            self._pending[rank].append(value)
        return [replies.popleft() for replies in self._pending]

    def _wait(self, seq: int, timeout: Optional[float] = None) -> list:
        while self._received <= seq:
            replies = self._collect("a call" if timeout is None else "a step", timeout)
            if self._received in self._unread:
                self._unread.discard(self._received)
            else:
                self._replies[self._received] = replies
            self._received += 1
        return self._replies.pop(seq)

    def _call(self, method: str, *args) -> list:
        return self._wait(self._send(method, *args))

    # ---- Executor ----------------------------------------------------------------------------------
    def plan_memory(self, cfg, useful_blocks: int) -> MemoryPlan:
        """Every rank's plan; the smallest pool (every rank allocates the same number of blocks)."""
        return min(self._call("plan_memory", cfg, useful_blocks), key=lambda p: p.num_blocks)

    def allocate_kv(self, num_blocks: int) -> None:
        self._call("allocate_kv", num_blocks)

    def enable_graphs(self, sizes: list[int], token_sizes: list[int]) -> None:
        self._call("enable_graphs", sizes, token_sizes)

    def init_speculation(self, num_speculative_tokens: int, draft_loops: int, synthetic_acceptance,
                         graph_sizes: Optional[list[int]]) -> None:
        self._call("init_speculation", num_speculative_tokens, draft_loops, synthetic_acceptance, graph_sizes)

    def execute(self, step: StepInput, guide=None, late_masks=None) -> RemoteStep:
        if late_masks is not None:  # the masks follow the step: built while the ranks run its forward
            self._unread.add(self._send("execute", step, "late"))
            try:
                slots, masks = late_masks()
            except BaseException as exc:  # the ranks wait inside the step for masks that will not come
                self._failure = f"a step's late masks could not be built ({type(exc).__name__}: {exc}); " \
                                "the tensor-parallel ranks are stuck in that step"
                raise
            return RemoteStep(self, self._send("late_masks", slots, masks))
        seq = self._send("execute", step, "guided" if guide is not None else None)
        if guide is not None:
            drafted = self._wait(seq, self.step_timeout_s)[0]
            seq = self._send("verify_masks", guide(drafted))
        return RemoteStep(self, seq)

    def graph_stats(self) -> dict:
        return self._call("graph_stats")[0]

    def update_weights(self, weights: list) -> None:
        """Every rank gets every tensor whole (CPU tensors travel through shared memory) and keeps its shard."""
        self._call("update_weights", [(name, t.detach().cpu()) for name, t in weights])

    def sleep(self, level: int) -> int:
        return sum(self._call("sleep", level))

    def wake_up(self, tags: list[str]) -> None:
        self._call("wake_up", tags)

    def export_swapped(self, step: StepInput) -> list:
        """Every rank swaps out its heads; each sequence's copies (K, V, key depths) come back whole:
        the ranks' K and V joined along the K/V heads (dim 3), as one engine would hold them."""
        per_rank = self._call("export_swapped", step)
        return [[torch.cat([copies[i][0] for copies in per_rank], dim=3),
                 torch.cat([copies[i][1] for copies in per_rank], dim=3), per_rank[0][i][2]]
                for i in range(len(step.swap_out))]

    def import_swapped(self, swap_id: int, saved: list) -> None:
        """Whole copies (K, V, key depths) from another engine: each rank holds its heads' share."""
        k, v, depths = saved
        shares = zip(k.chunk(self.size, dim=3), v.chunk(self.size, dim=3))
        self._wait(self._send_each("import_swapped", [(swap_id, [ks.contiguous(), vs.contiguous(), depths])
                                                      for ks, vs in shares]))

    def worker_processes(self) -> list[dict]:
        return [{"rank": rank, "pid": proc.pid, "device": device}
                for rank, (proc, device) in enumerate(zip(self._procs, self.devices))]

    def shutdown(self, wait: bool = True) -> None:
        """Stop the ranks: ask them to exit (wait=True: for up to 10 s), then terminate any left."""
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            if wait:
                proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            if proc.is_alive():  # a stopped or hung rank ignores SIGTERM
                proc.kill()
                proc.join(timeout=5)
        self._conns, self._procs = [], []
        self._store = None
