"""step_timeout_s: a tensor-parallel rank or a replica process that stops answering mid-step is
failed as hung (its requests end with an error naming it), instead of stalling the engine forever.

A hung process is simulated with SIGSTOP: it stays alive, holds its pipe and answers nothing."""

from __future__ import annotations

import collections
import os
import queue
import signal
import time

import pytest
from test_data_parallel import LONG, OPTIONS, SHORT_PROMPTS, _finish_all, _run, _signature

from rlt_runtime import ConfigError, EngineConfig, LLM, SamplingParams
from rlt_runtime.engine.data_parallel import DataParallelEngine
from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.engine.process_replica import ProcessReplica
from rlt_runtime.errors import ReplicaError
from rlt_runtime.executor.multiproc import MultiprocExecutor


@pytest.mark.parametrize("bad", [0, -1.0, "30", True, float("nan")])
def test_step_timeout_must_be_positive_seconds_or_none(bad):
    with pytest.raises(ConfigError, match=r"step_timeout_s must be None or a number of seconds > 0"):
        EngineConfig(step_timeout_s=bad).validate_static()
    EngineConfig(step_timeout_s=None).validate_static()
    EngineConfig(step_timeout_s=0.5).validate_static()
    EngineConfig(step_timeout_s=float("inf")).validate_static()  # waits forever, like None


class _Process:
    def __init__(self, pid: int):
        self.pid, self.killed = pid, False

    def is_alive(self) -> bool:
        return not self.killed

    def kill(self) -> None:
        self.killed = True

    def join(self, timeout=None) -> None:
        pass


def test_silent_ranks_are_named_after_the_step_timeout():
    """The group's collector raises once the timeout passes, naming the ranks that sent nothing
    (a rank that answered is not named)."""
    executor = MultiprocExecutor.__new__(MultiprocExecutor)
    executor._procs = [_Process(11), _Process(12)]
    executor._pending = [collections.deque(["reply"]), collections.deque()]
    executor._inbox, executor._failure = queue.SimpleQueue(), None
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^tensor-parallel rank 1 \(pid 12, alive\) sent no reply to a step "
                                           r"within 0.05 s \(step_timeout_s\): hung$"):
        executor._collect("a step", 0.05)
    assert 0.05 <= time.monotonic() - start < 5


class _SilentPipe:
    def poll(self, timeout=0.0) -> bool:
        time.sleep(min(timeout or 0.0, 0.05))
        return False

    def send(self, msg) -> None:
        pass


def _silent_replica(timeout: float) -> ProcessReplica:
    replica = ProcessReplica.__new__(ProcessReplica)
    replica.index, replica.label, replica.info, replica.failure = 1, "data-parallel replica 1", {"device": "cpu"}, None
    replica.step_timeout_s, replica._heard, replica._seq = timeout, time.monotonic(), 0
    replica._conn, replica.process = _SilentPipe(), _Process(42)
    return replica


def test_a_replica_silent_while_busy_is_failed_and_stopped():
    replica = _silent_replica(0.05)
    replica._heard -= 1.0
    replica.check_responsive(False)  # idle: silence is expected, and the clock restarts
    assert replica.alive
    replica.check_responsive(True)
    assert replica.alive  # busy, but silent for less than the timeout
    replica._heard -= 1.0
    replica.check_responsive(True)
    assert replica.failure == ("data-parallel replica 1 (cpu, pid 42) sent nothing for 0.05 s while it had requests "
                               "(step_timeout_s): hung, stopped")
    assert replica.process.killed


def test_a_command_without_answer_fails_the_replica():
    replica = _silent_replica(0.05)
    with pytest.raises(ReplicaError, match=r"did not answer 'add' within 0.05 s \(step_timeout_s\): hung, stopped"):
        replica.add_request("r", {"prompt_token_ids": [1]}, SamplingParams(), arrival_time=0.0, arrival_index=0)
    assert not replica.alive and replica.process.killed


@pytest.mark.slow
def test_a_stopped_replica_fails_only_its_requests():
    """Replica 1 stops mid-request: within the timeout its requests end with an error naming it, new
    requests go to replica 0, and replica 0's requests keep the bits of one engine."""
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, step_timeout_s=3, **OPTIONS)
    try:
        reference = _run(LLMEngine("ouro-tiny", **OPTIONS), SHORT_PROMPTS, [LONG] * 4)
        for i, prompt in enumerate(SHORT_PROMPTS):  # q0, q2 on replica 0; q1, q3 on replica 1
            engine.add_request(f"q{i}", prompt, LONG)
        streamed = {}
        while "q1" not in streamed:
            streamed.update({o.request_id: o for o in engine.step() if o.outputs[0].token_ids})
        os.kill(engine.replicas[1].pid, signal.SIGSTOP)
        start = time.monotonic()
        done = _finish_all(engine)
        assert time.monotonic() - start < 60
        for rid in ("q1", "q3"):
            out = done[rid]
            assert out.outputs[0].finish_reason == "error" and "replica 1" in out.error
            assert "while it had requests (step_timeout_s): hung, stopped" in out.error
        for rid in ("q0", "q2"):
            assert _signature(done[rid]) == _signature(reference[rid])
        engine.add_request("after", SHORT_PROMPTS[1], LONG)
        assert _signature(_finish_all(engine)["after"]) == _signature(reference["q1"])
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_stopped_tensor_parallel_rank_fails_the_step():
    """Rank 1 of a tensor_parallel_size=2 engine stops: the next step raises within the timeout,
    naming the silent ranks; later steps raise the same error at once; shutting the engine down
    ends both rank processes."""
    llm = LLM("ouro-tiny", tensor_parallel_size=2, step_timeout_s=3, **OPTIONS)
    pids = [w["pid"] for w in llm.engine.executor.worker_processes()]
    try:
        assert llm.generate([SHORT_PROMPTS[0]], LONG, use_tqdm=False)[0].outputs[0].finish_reason == "length"
        os.kill(pids[1], signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"rank 1 \(pid \d+, alive\) sent no reply to a step within 3 s "
                                               r"\(step_timeout_s\): hung"):
            llm.generate([SHORT_PROMPTS[1]], LONG, use_tqdm=False)
        assert time.monotonic() - start < 30
        with pytest.raises(RuntimeError, match=r"sent no reply to a step within 3 s"):
            llm.generate([SHORT_PROMPTS[2]], LONG, use_tqdm=False)
    finally:
        llm.engine.shutdown()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
