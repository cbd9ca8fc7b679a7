"""The public API: LLM.generate, SamplingParams validation, bad requests, the CLI."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

from pathlib import Path

import pytest

from rlt_runtime import LLM, ConfigError, RequestError, SamplingParams
from rlt_runtime.models.tokenizer import IncrementalDetokenizer

ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def llm(**options) -> LLM:
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4, **options)


def test_mixed_prompts_token_ids_and_text():
    m = llm()
    outs = m.generate(["Hello", {"prompt_token_ids": [5, 6, 7]}, [9, 10, 11, 12, 13]],
                      SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), use_tqdm=False)
    assert [o.prompt for o in outs] == ["Hello", None, None]
    assert outs[1].prompt_token_ids == [5, 6, 7]
    for o in outs:
        c = o.outputs[0]
        assert o.finished and c.finish_reason == "length" and len(c.token_ids) == 5 and len(c.exit_depths) == 5
        assert c.text == m.tokenizer.decode(c.token_ids)


def test_vllm_text_prompt_dicts_are_encoded_and_other_dicts_named():
    """{"prompt": text} (vLLM's TextPrompt) is the text prompt; {"prompt_token_ids", "prompt"} keeps
    its ids; other keys are a RequestError naming the accepted forms."""
    m = llm()
    p = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    text, as_dict, given = m.generate(["Hello", {"prompt": "Hello"}, {"prompt": "Hi", "prompt_token_ids": [5, 6]}], p,
                                      use_tqdm=False)
    assert as_dict.prompt == "Hello" and as_dict.prompt_token_ids == text.prompt_token_ids
    assert as_dict.outputs[0].token_ids == text.outputs[0].token_ids
    assert given.prompt == "Hi" and given.prompt_token_ids == [5, 6]
    for bad in ({"text": "Hello"}, {}, {"prompt": "x", "multi_modal_data": {}}):
        with pytest.raises(RequestError, match="a dict prompt has 'prompt_token_ids'"):
            m.generate([bad], p, use_tqdm=False)


def test_truncate_prompt_tokens_keeps_one_end_of_the_prompt():
    """truncate_prompt_tokens=k runs the last k prompt tokens (the first k with truncation_side
    "right"), as if they were the prompt; -1 keeps what the context takes with room for one output."""
    m = llm()
    prompt = list(range(5, 25))
    p = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    cut = [SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, truncate_prompt_tokens=6, truncation_side=side)
           for side in ("left", "right")]
    same = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, truncate_prompt_tokens=len(prompt))
    left, right, tail, head, whole = m.generate([prompt, prompt, prompt[-6:], prompt[:6], prompt], [*cut, p, p, same],
                                                use_tqdm=False)
    assert left.prompt_token_ids == prompt[-6:] and right.prompt_token_ids == prompt[:6]
    assert left.outputs[0].token_ids == tail.outputs[0].token_ids
    assert right.outputs[0].token_ids == head.outputs[0].token_ids != tail.outputs[0].token_ids
    text = m.generate(["Hello there"], SamplingParams(max_tokens=2, truncate_prompt_tokens=2), use_tqdm=False)[0]
    kept = m.tokenizer.encode("Hello there")[-2:]
    assert text.prompt_token_ids == kept and text.prompt == m.tokenizer.decode(kept)
    longest = m.engine.max_model_len - 1
    out = m.generate([[7] * (longest + 40)], SamplingParams(max_tokens=1, truncate_prompt_tokens=-1), use_tqdm=False)[0]
    assert len(out.prompt_token_ids) == longest and len(out.outputs[0].token_ids) == 1
    assert whole.prompt_token_ids == prompt  # k at or above the prompt's length changes nothing
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ConfigError, match="^truncate_prompt_tokens"):
            SamplingParams(truncate_prompt_tokens=bad)
    with pytest.raises(ConfigError, match="^truncation_side"):
        SamplingParams(truncate_prompt_tokens=3, truncation_side="middle")


def test_batch_composition_does_not_change_greedy_outputs():
    m = llm()
    p = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    alone = m.generate(["abc"], p, use_tqdm=False)[0].outputs[0].token_ids
    batched = m.generate(["xyz", "abc", "hello there"], p, use_tqdm=False)[1].outputs[0].token_ids
    assert alone == batched


def test_seeds_reproduce_and_differ():
    m = llm()
    p = SamplingParams(max_tokens=8, temperature=1.0, seed=1234, ignore_eos=True)
    a = m.generate(["seeded"], p, use_tqdm=False)[0].outputs[0].token_ids
    b = m.generate(["other", "seeded", "third"], p, use_tqdm=False)[1].outputs[0].token_ids
    c = m.generate(["seeded"], SamplingParams(max_tokens=8, temperature=1.0, seed=99, ignore_eos=True), use_tqdm=False)
    assert a == b and a != c[0].outputs[0].token_ids


def test_n_samples_share_the_prompt_and_differ():
    m = llm()
    out = m.generate(["many"], SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=5, ignore_eos=True), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_stop_token_ids_and_eos():
    m = llm()
    base = m.generate(["stop me"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    stop_at = base.token_ids[2]
    out = m.generate(["stop me"], SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[stop_at]), use_tqdm=False)[0].outputs[0]
    first = base.token_ids.index(stop_at)
    assert out.token_ids == base.token_ids[: first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_at


def test_stop_strings_are_cut_from_the_text():
    m = llm()
    base = m.generate(["text"], SamplingParams(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True), use_tqdm=False)
    text = base[0].outputs[0].text
    probe = next((text[i:i + 2] for i in range(2, len(text) - 2) if text[i:i + 2].isprintable() and text[i:i + 2].strip()), None)
    if probe is None:
        pytest.skip("the random model produced no printable text for this seed")
    out = m.generate(["text"], SamplingParams(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True, stop=[probe]),
                     use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == probe
    assert out.text == text[: text.index(probe)] and probe not in out.text


def test_stop_string_completed_by_the_final_flush_reports_stop():
    """The last token leaves an incomplete UTF-8 character that only the end-of-generation flush
    emits (as U+FFFD); a stop string it completes is cut and reported like any other."""
    m = llm()
    p = dict(temperature=1.0, seed=3, ignore_eos=True)
    base = m.generate(["flush"], SamplingParams(max_tokens=32, **p), use_tqdm=False)[0]
    ids = base.outputs[0].token_ids
    for j in range(1, len(ids) + 1):
        detok = IncrementalDetokenizer(m.tokenizer, base.prompt_token_ids)
        shown = "".join(detok.add(t) for t in ids[:j])
        held = detok.flush()
        stop = shown[-1:] + held
        if held and shown and (shown + held).find(stop) == len(shown) - 1:
            break
    else:
        raise AssertionError("no output prefix of this seed ends inside a character; pick another seed")
    out = m.generate(["flush"], SamplingParams(max_tokens=j, stop=[stop], **p), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ids[:j]
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", stop, shown[:-1])


def test_without_preemption_requests_wait_and_match_a_large_pool():
    """enable_preemption=False with a pool that holds one request's lifetime at a time: requests
    wait for room instead of being preempted, and the outputs equal those of a large pool."""
    prompts = [list(range(10 + 7 * i, 20 + 7 * i)) for i in range(6)]  # one block per plane each
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)  # 21 positions: two blocks
    expected = [(o.outputs[0].token_ids, o.outputs[0].exit_depths) for o in llm().generate(prompts, params, use_tqdm=False)]
    tiny = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, block_size=16, num_blocks=12, enable_preemption=False)
    eng = tiny.engine
    for i, prompt in enumerate(prompts):
        eng.add_request(str(i), prompt, params)
    done, most = {}, 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[int(out.request_id)] = (out.outputs[0].token_ids, out.outputs[0].exit_depths)
        most = max(most, len(eng.scheduler.running))
        eng.check_invariants()
    assert eng.stats()["preemptions"] == 0 and most == 1  # 4 planes x 2 blocks each: one lifetime fits in 12
    assert [done[i] for i in range(len(prompts))] == expected


_UNSEEDED = """
import json
from rlt_runtime import LLM, SamplingParams
m = LLM("ouro-tiny", dtype="float32", max_num_seqs=4)
outs = m.generate([[5, 6, 7] * 12, "unseeded"], SamplingParams(n=2, max_tokens=6, temperature=1.0, ignore_eos=True),
                  use_tqdm=False)
print(json.dumps([[c.token_ids for c in o.outputs] for o in outs]))
"""


def test_unseeded_sampling_is_reproducible_across_processes():
    """Unseeded requests draw keys from the engine seed: two fresh processes with different
    PYTHONHASHSEED produce the same tokens (and the samples of a request still differ)."""
    runs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=str(ROOT))
        res = subprocess.run([sys.executable, "-c", _UNSEEDED], capture_output=True, text=True, timeout=300, env=env,
                             cwd=str(ROOT))
        assert res.returncode == 0, res.stderr
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]
    assert all(o[0] != o[1] for o in runs[0])


def test_logprobs_shape():
    m = llm()
    c = m.generate(["lp"], SamplingParams(max_tokens=3, temperature=0, logprobs=4, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(c.logprobs) == 3
    for tok, lp in zip(c.token_ids, c.logprobs):
        assert len(lp.top) == 4 and lp.logprob <= 0 and tok in lp.top  # greedy: the chosen token is the top one


def test_sampling_params_validation_names_fields():
    for kwargs, field in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": 0}, "top_k"),
                          ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"logprobs": 99}, "logprobs"),
                          ({"min_loops": 3, "max_loops": 2}, "min_loops"), ({"exit_threshold": 2.0}, "exit_threshold"),
                          ({"stop": [""]}, "stop"), ({"seed": -1}, "seed")]:
        with pytest.raises(ConfigError, match=field):
            SamplingParams(**kwargs)


def test_bad_requests_are_rejected_and_leave_the_engine_usable():
    m = llm()
    eng = m.engine
    with pytest.raises(RequestError, match="token ids"):
        m.generate([[1, 2, 10**6]], use_tqdm=False)
    with pytest.raises(RequestError, match="max_model_len"):
        m.generate([[5] * eng.max_model_len], use_tqdm=False)
    with pytest.raises(RequestError, match="max_loops"):
        m.generate(["x"], SamplingParams(max_loops=9), use_tqdm=False)
    with pytest.raises(RequestError, match="empty"):
        m.generate([""], use_tqdm=False)
    # A failing prompt in a batch aborts the prompts added before it and leaks nothing.
    with pytest.raises(RequestError):
        m.generate(["fine", [1, -5]], use_tqdm=False)
    assert not eng.has_unfinished_requests()
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks
    assert m.generate(["still works"], SamplingParams(max_tokens=2), use_tqdm=False)[0].finished


def test_engine_options_validation():
    with pytest.raises(ConfigError, match="unknown engine option"):
        LLM("ouro-tiny", max_num_seq=3)
    with pytest.raises(ConfigError, match="mutually exclusive"):
        LLM("ouro-tiny", num_blocks=10, kv_cache_memory_bytes=1 << 20)
    with pytest.raises(ConfigError, match="kv_layout"):
        LLM("ouro-tiny", kv_layout="compress-s4")
    with pytest.raises(ConfigError, match="exit_mode"):
        LLM("huginn-tiny", exit_mode="ouro")
    with pytest.raises(ConfigError, match="attention_backend"):
        LLM("ouro-tiny", attention_backend="nope")
    with pytest.raises(Exception, match="preset"):
        LLM("no-such-model")


def test_abort_frees_blocks_immediately():
    m = llm()
    eng = m.engine
    eng.add_request("a", "long running request", SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    eng.step()
    assert eng.kv.pool.num_free < eng.kv.pool.num_blocks
    out = eng.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks and not eng.has_unfinished_requests()


def test_cli_readme_command_prints_text():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = subprocess.run([sys.executable, "-m", "rlt_runtime.entrypoints.cli", "--model", "ouro-tiny", "--prompt", "Hello"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Hello") and len(res.stdout.strip()) > len("Hello")


def test_cli_json_and_errors(tmp_path):
    pf = tmp_path / "p.jsonl"
    pf.write_text('"one"\n{"prompt_token_ids": [5, 6]}\n')
    res = subprocess.run([sys.executable, "-m", "rlt_runtime.entrypoints.cli", "--prompt-file", str(pf), "--json",
                          "--max-tokens", "3", "--temperature", "0", "--dtype", "float32"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(rows) == 2 and len(rows[1]["outputs"][0]["exit_depths"]) == 3
    bad = subprocess.run([sys.executable, "-m", "rlt_runtime.entrypoints.cli", "--prompt", "x", "--top-p", "7"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "top_p" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_cli_sampling_flags_reach_the_params(capsys):
    from rlt_runtime.entrypoints.cli import build_parser, main, sampling_params

    args = build_parser().parse_args(["--allowed-token-ids", "17", "33", "--truncate-prompt-tokens", "4",
                                      "--thinking-token-budget", "2", "--repetition-detection",
                                      '{"max_pattern_size": 2, "min_count": 3}'])
    p = sampling_params(args)
    assert (p.allowed_token_ids, p.truncate_prompt_tokens, p.thinking_token_budget) == ([17, 33], 4, 2)
    assert (p.repetition_detection.max_pattern_size, p.repetition_detection.min_count) == (2, 3)
    assert main(["--prompt", "Hello", "--json", "--max-tokens", "4", "--temperature", "0", "--dtype", "float32",
                 "--allowed-token-ids", "17", "33", "--truncate-prompt-tokens", "2"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert set(row["outputs"][0]["token_ids"]) <= {17, 33} and len(row["prompt_token_ids"]) == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--repetition-detection", "[1]"])


def test_profile_option_writes_a_trace(tmp_path):
    m = LLM("ouro-tiny", dtype="float32", max_num_seqs=2, profile_dir=str(tmp_path), profile_steps=(1, 2))
    m.generate(["profile me"], SamplingParams(max_tokens=6, ignore_eos=True), use_tqdm=False)
    traces = list(tmp_path.glob("rlt-trace-*.json"))
    assert len(traces) == 1 and json.loads(traces[0].read_text())["traceEvents"]


def test_start_and_stop_profile_write_a_trace_of_what_ran_between(tmp_path):
    """vLLM's start_profile / stop_profile: with profile_steps (0, 0) only they record; the trace
    holds the steps run between them; misuse is refused by name."""
    with pytest.raises(RequestError, match="start_profile needs profile_dir"):
        LLM("ouro-tiny", dtype="float32", max_num_seqs=2).start_profile()
    m = LLM("ouro-tiny", dtype="float32", max_num_seqs=2, profile_dir=str(tmp_path), profile_steps=(0, 0))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    m.generate(["not recorded"], params, use_tqdm=False)
    assert not list(tmp_path.glob("rlt-trace-*.json"))  # (no automatic window)
    with pytest.raises(RequestError, match="no profile started by start_profile"):
        m.stop_profile()
    m.start_profile()
    with pytest.raises(RequestError, match="already recording"):
        m.start_profile()
    m.generate(["recorded"], params, use_tqdm=False)
    (path,) = m.stop_profile()
    events = json.loads(open(path).read())["traceEvents"]
    assert path.startswith(str(tmp_path)) and any("step" in str(e.get("name", "")) for e in events)


def test_data_parallel_replicas_profile_into_their_own_directories(tmp_path):
    m = LLM("ouro-tiny", dtype="float32", device="cpu", max_num_seqs=2, data_parallel_size=2,
            profile_dir=str(tmp_path), profile_steps=(0, 0))
    try:
        m.start_profile()
        m.generate(["one", "two", "three"], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
        paths = m.stop_profile()
        assert sorted(p.split("/")[-2] for p in paths) == ["replica-0", "replica-1"]
    finally:
        m.engine.shutdown()
