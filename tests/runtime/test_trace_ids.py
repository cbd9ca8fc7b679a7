"""Exit-trace replay and recording keyed by caller-chosen trace ids (SamplingParams.trace_id)."""

from __future__ import annotations

import json

import pytest

from rlt_runtime import LLM, ConfigError, RequestError, SamplingParams

TRACE = {"a": [4, 1, 3, 2, 4, 1], "b": [4, 2, 2, 1, 3, 3], "gen-0": [4, 3, 3, 3, 3, 3]}
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def replay_llm(trace=TRACE, **options) -> LLM:
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4, exit_mode="trace", exit_trace=trace, **options)


def depths(outputs) -> list[list[int]]:
    return [o.outputs[0].exit_depths for o in outputs]


def test_trace_ids_pick_entries_across_generate_calls():
    llm = replay_llm()
    first = llm.generate(["x", "y"], PARAMS, use_tqdm=False, trace_ids=["a", "b"])
    assert depths(first) == [TRACE["a"], TRACE["b"]]
    # A second call on the same LLM (new internal request ids) replays the same entries, in any order.
    second = llm.generate(["y", "x", "x"], PARAMS, use_tqdm=False, trace_ids=["b", "a", "b"])
    assert depths(second) == [TRACE["b"], TRACE["a"], TRACE["b"]]
    assert second[1].outputs[0].token_ids == first[0].outputs[0].token_ids  # same prompt, same depths
    per_prompt = [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, trace_id=t) for t in ("b", "a")]
    assert depths(llm.generate(["x", "y"], per_prompt, use_tqdm=False)) == [TRACE["b"], TRACE["a"]]


def test_default_key_is_the_request_id_and_a_miss_names_trace_id():
    llm = replay_llm()
    assert depths(llm.generate(["x"], PARAMS, use_tqdm=False)) == [TRACE["gen-0"]]  # today's behaviour
    with pytest.raises(RequestError, match=r"trace_id: none given .* request id 'gen-1'.*SamplingParams.trace_id"):
        llm.generate(["x"], PARAMS, use_tqdm=False)
    with pytest.raises(RequestError, match=r"trace_id 'zz' is not in exit_trace"):
        llm.generate(["x", "y"], PARAMS, use_tqdm=False, trace_ids=["a", "zz"])
    assert not llm.engine.has_unfinished_requests()  # the accepted first prompt was aborted
    with pytest.raises(RequestError, match="trace_ids must be a list of one trace id per prompt"):
        llm.generate(["x", "y"], PARAMS, use_tqdm=False, trace_ids=["a"])
    with pytest.raises(ConfigError, match="trace_id must be None or a non-empty string"):
        SamplingParams(trace_id="")


def test_record_under_trace_ids_then_replay_twice(tmp_path):
    path = tmp_path / "trace.json"
    params = SamplingParams(max_tokens=8, temperature=0, exit_threshold=0.55, ignore_eos=True)
    rec = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, record_exit_trace=str(path))
    recorded = rec.generate(["one", "two"], params, use_tqdm=False, trace_ids=["q1", "q2"])
    saved = json.loads(path.read_text())["depths_by_request"]
    assert saved == {"q1": recorded[0].outputs[0].exit_depths, "q2": recorded[1].outputs[0].exit_depths}
    assert any(d < 4 for d in saved["q1"][1:] + saved["q2"][1:])  # the threshold made tokens exit early
    replay = replay_llm(trace=str(path))
    plain = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    for order in (["q2", "q1"], ["q1", "q2"]):
        again = replay.generate(["two" if t == "q2" else "one" for t in order], plain, use_tqdm=False, trace_ids=order)
        for t, out in zip(order, again):
            want = recorded[0 if t == "q1" else 1].outputs[0]
            assert out.outputs[0].exit_depths == want.exit_depths and out.outputs[0].token_ids == want.token_ids


def test_n_samples_record_with_an_index_suffix(tmp_path):
    path = tmp_path / "trace.json"
    rec = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, record_exit_trace=str(path))
    out = rec.generate(["s"], SamplingParams(n=2, max_tokens=3, seed=1, ignore_eos=True), use_tqdm=False,
                       trace_ids=["k"])[0]
    saved = json.loads(path.read_text())["depths_by_request"]
    assert saved == {"k[0]": out.outputs[0].exit_depths, "k[1]": out.outputs[1].exit_depths}
