"""What the engine hands its executor: plain data only (it must pickle to worker processes, and
hold no engine Request), SamplingParams only in the step that admits a sequence (a decode row's
per-step data stays small), and swapped-out K/V kept by the worker is freed when its request ends."""

from __future__ import annotations

import dataclasses
import pickle

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.engine.request import Request
from rlt_runtime.step import StepInput

OPTIONS = dict(dtype="float32", device="cpu", max_num_seqs=4, block_size=16, enable_prefix_caching=False)
PROMPTS = [list(range(5, 30)), [40, 41, 42], list(range(60, 95)), [7, 8, 9, 10, 11]]


def _record_steps(engine) -> list[StepInput]:
    steps, execute = [], engine.executor.execute

    def recording(step, guide=None, late_masks=None):
        steps.append(step)
        return execute(step, guide, late_masks)

    engine.executor.execute = recording
    return steps


def _objects(value):
    """Every object reachable through dataclass fields, lists, tuples and dicts."""
    yield value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _objects(getattr(value, f.name))
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _objects(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _objects(v)


def test_steps_are_plain_data_and_swapped_kv_is_freed_on_abort():
    llm = LLM("ouro-tiny", num_blocks=16, preemption_mode="swap", **OPTIONS)
    engine = llm.engine
    steps = _record_steps(engine)
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=3, logprobs=2, repetition_penalty=1.2, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    swapped = None
    while engine.has_unfinished_requests() and swapped is None:
        engine.step()
        swapped = next((r for r in engine.scheduler.waiting if r.swapped is not None), None)
    assert swapped is not None, "the pool was expected to force a swap"
    saved = engine.executor.worker.runner.swapped
    assert swapped.swapped["id"] in saved
    sid = swapped.swapped["id"]
    engine.abort_request(swapped.group_id)
    while engine.has_unfinished_requests():
        engine.step()
    assert any(sid in s.swap_free for s in steps)
    assert sid not in saved and not saved
    for step in steps:
        assert not any(isinstance(o, Request) for o in _objects(step))
        assert pickle.loads(pickle.dumps(step)) == step


# A decode row's pickled bytes past the first row (which also carries the field names). A row
# pickles to 85-95 bytes; its SamplingParams alone would add a few hundred.
MAX_BYTES_PER_DECODE_ROW = 128


def test_sampling_params_cross_at_admission_only_and_decode_rows_stay_small():
    llm = LLM("ouro-tiny", **OPTIONS)
    engine = llm.engine
    steps = _record_steps(engine)
    for i, prompt in enumerate(PROMPTS):  # one SamplingParams per request, as requests arrive in serving
        params = SamplingParams(max_tokens=8, temperature=0.7 * (i % 2), seed=i, logprobs=i % 3, stop=["ab", "cd"],
                                logit_bias={3: 1.5}, prompt_logprobs=1 if i == 0 else None, ignore_eos=True)
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    admitted = [r for s in steps for r in s.admitted]
    assert len(admitted) == len(PROMPTS) and all(isinstance(r.params, SamplingParams) for r in admitted)
    steady = [s for s in steps if s.decodes and not s.admitted and not s.prefills]
    assert steady, "the workload was expected to reach steps of decode rows alone"
    for step in steady:
        assert not any(isinstance(o, SamplingParams) for o in _objects(step))
        rows = step.decodes
        if len(rows) > 1:
            extra = len(pickle.dumps(rows)) - len(pickle.dumps(rows[:1]))
            assert extra / (len(rows) - 1) < MAX_BYTES_PER_DECODE_ROW, (extra, len(rows))
    # The per-row values the worker reads each step match the params they come from.
    for r in admitted:
        p = r.params
        assert (r.num_top_logprobs, r.num_prompt_top_logprobs, r.greedy) == (p.logprobs or 0, p.prompt_logprobs or 0,
                                                                             p.temperature == 0)
