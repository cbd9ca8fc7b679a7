"""Drive an engine through a staggered-arrival workload, or break one (shared by the engine test files)."""

from __future__ import annotations

from rlt_runtime import SamplingParams


def run_workload(llm, work, params: SamplingParams, prefix: str = "w") -> dict:
    """work: [(prompt, arrival step)]. Adds each request at its step, steps until all finish and
    checks the block/slot invariants after every step and a full pool at the end.
    Returns {index: CompletionOutput of sample 0}."""
    eng = llm.engine
    pending = sorted(((arr, i, p) for i, (p, arr) in enumerate(work)), key=lambda x: x[0])
    done, step = {}, 0
    while pending or eng.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, i, p = pending.pop(0)
            eng.add_request(f"{prefix}{i}", p, params)
        for out in eng.step():
            if out.finished:
                done[int(out.request_id[len(prefix):])] = out.outputs[0]
        eng.check_invariants()
        step += 1
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks
    return done


def fail_after_steps(engine, steps: int) -> None:
    """Make an LLMEngine's step raise RuntimeError("device lost") after `steps` good steps."""
    from rlt_runtime.engine.llm_engine import LLMEngine

    calls = []

    def failing_step(final_only=False):
        calls.append(1)
        if len(calls) > steps:
            raise RuntimeError("device lost")
        return LLMEngine.step(engine, final_only)

    engine.step = failing_step
