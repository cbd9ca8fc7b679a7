"""Disaggregated prefill: a prefill engine hands each request's K/V to a decode engine.

The reference for every output is one LLMEngine given the same requests: the handoff moves every
plane's K/V and the key-depth table, and the decode engine re-derives everything else from the
request (random keys from the arrival index, logit-processing state from the tokens), so tokens,
exit depths and log-probabilities must match bit for bit. Block pools must be back to their free
count on both engines after finishing, aborting and failing.
"""

from __future__ import annotations

import os

import pytest
import torch

from rlt_runtime import ConfigError, EngineConfig, SamplingParams
from rlt_runtime.engine.data_parallel import build_engine
from rlt_runtime.engine.disaggregated import DECODE, PREFILL, DisaggregatedEngine, role_devices, role_options
from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.errors import ReplicaError
from rlt_runtime.outputs import OutputAccumulator
from workload import fail_after_steps

OPTIONS = dict(dtype="float32", device="cpu", max_num_seqs=4, num_blocks=256, max_model_len=128)
LONG = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)


# ---- options ---------------------------------------------------------------------------------------
def test_options_are_checked():
    with pytest.raises(ConfigError, match="disaggregated_prefill must be a boolean"):
        EngineConfig(disaggregated_prefill="yes").validate_static()
    with pytest.raises(ConfigError, match="data_parallel_size=2"):
        EngineConfig(disaggregated_prefill=True, data_parallel_size=2).validate_static()
    with pytest.raises(ConfigError, match="disaggregated_prefill=True"):
        LLMEngine("ouro-tiny", disaggregated_prefill=True, **OPTIONS)
    with pytest.raises(ConfigError, match="record_exit_trace cannot be combined with disaggregated_prefill"):
        DisaggregatedEngine("ouro-tiny", record_exit_trace="t.json", backend="inprocess", **OPTIONS)


def test_role_devices(monkeypatch):
    assert role_devices(EngineConfig(device="cpu")) == ("cpu", "cpu")
    with pytest.raises(ConfigError, match="names one GPU"):
        role_devices(EngineConfig(device="cuda:1"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert role_devices(EngineConfig(device="auto")) == ("cpu", "cpu")
    with pytest.raises(ConfigError, match=r"needs 2 CUDA devices .* found 0"):
        role_devices(EngineConfig(device="cuda"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert role_devices(EngineConfig(device="auto")) == ("cuda:0", "cuda:1")
    with pytest.raises(ConfigError, match=r"needs 4 CUDA devices \(a prefill engine of 2 and a decode engine of 2 "
                                          r"tensor-parallel ranks\).* found 2"):
        role_devices(EngineConfig(device="cuda", tensor_parallel_size=2))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert role_devices(EngineConfig(device="cuda", tensor_parallel_size=2)) == ("cuda:0", "cuda:2")
    uneven = EngineConfig(device="cuda", disaggregated_prefill=True, prefill_tensor_parallel_size=1, tensor_parallel_size=2)
    assert role_devices(uneven) == ("cuda:0", "cuda:1")  # the decode engine's two ranks take cuda:1 and cuda:2
    assert (role_options(uneven, PREFILL)["tensor_parallel_size"], role_options(uneven, DECODE)["tensor_parallel_size"]) \
        == (1, 2)
    with pytest.raises(ConfigError, match=r"needs 5 CUDA devices \(a prefill engine of 4 and a decode engine of 1"):
        role_devices(EngineConfig(device="cuda", disaggregated_prefill=True, prefill_tensor_parallel_size=4))
    with pytest.raises(ConfigError, match="prefill_tensor_parallel_size=2 sizes the prefill engine"):
        EngineConfig(prefill_tensor_parallel_size=2).validate_static()


# ---- bitwise equality with one engine ----------------------------------------------------------------
def _workload():
    """Greedy, seeded, unseeded, n=2 (best_of), early-exit, max_loops, prompt log-probabilities, a
    request that ends with its first token (never handed off), and two prompts sharing a block."""
    shared = list(range(3, 19))  # one full 16-token block (prefix-cache hit on the prefill engine)
    prompts = [shared + [40, 41], [7, 8, 9, 10, 11], shared + [50], list(range(60, 90)), [2, 3],
               [100 + i for i in range(20)], [5, 6]]
    params = [
        SamplingParams(max_tokens=8, temperature=0, logprobs=3, ignore_eos=True, exit_threshold=0.6),
        SamplingParams(max_tokens=7, temperature=1.0, seed=11, logprobs=2, ignore_eos=True, prompt_logprobs=2),
        SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, logprobs=1, ignore_eos=True),  # unseeded
        SamplingParams(max_tokens=6, temperature=1.0, seed=3, n=2, best_of=3, logprobs=2, ignore_eos=True,
                       exit_threshold=0.5),
        SamplingParams(max_tokens=1, temperature=0, logprobs=1),  # finishes on the prefill engine
        SamplingParams(max_tokens=5, temperature=0, logprobs=2, ignore_eos=True, max_loops=2),
        SamplingParams(max_tokens=6, temperature=0.7, ignore_eos=True, repetition_penalty=1.3),  # unseeded, processed
    ]
    return prompts, params


HANDED_OFF = 6  # every request of the workload but the max_tokens=1 one


def _add_all(engine, prompts, params):
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"q{i}", prompt, p)


def _finish_all(engine) -> dict:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def _signature(out):
    """Everything a request's result is: tokens, exit depths, logprobs with their top-N, text."""
    samples = [(c.index, c.token_ids, c.exit_depths, c.finish_reason, c.text, c.cumulative_logprob,
                None if c.logprobs is None else [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
               for c in out.outputs]
    prompt = None if out.prompt_logprobs is None else [
        None if lp is None else (lp.logprob, sorted(lp.top.items())) for lp in out.prompt_logprobs]
    return samples, prompt, out.error


_REFERENCES: dict = {}


def _reference(model: str, prompts=None, params=None, **options) -> dict:
    """One LLMEngine's results (signatures by request id) for the workload (default: _workload())."""
    if prompts is None:
        prompts, params = _workload()
    key = repr((model, prompts, params, sorted(options.items())))
    if key not in _REFERENCES:
        engine = LLMEngine(model, **dict(OPTIONS, **options))
        _add_all(engine, prompts, params)
        _REFERENCES[key] = {rid: _signature(out) for rid, out in _finish_all(engine).items()}
    return _REFERENCES[key]


def _check_pools_free(engine: DisaggregatedEngine) -> None:
    for worker in engine.workers:
        worker.engine.check_invariants()
        pool = worker.engine.kv.pool
        assert pool.num_free == pool.num_blocks, f"{worker.role}: {pool.num_blocks - pool.num_free} blocks still held"
        assert not worker.engine.has_unfinished_requests()


# dtype "auto" is float32 on CPU; bfloat16 is the default on CUDA.
@pytest.mark.parametrize("model,dtype", [("ouro-tiny", "float32"), ("huginn-tiny", "float32"), ("ouro-tiny", "bfloat16"),
                                         pytest.param("huginn-tiny", "bfloat16", marks=pytest.mark.slow)])
def test_in_process_handoff_matches_one_engine_bit_for_bit(model, dtype):
    """Catches a handoff that drops a plane, the key-depth rows (prompt keys would then be read at
    depth 0), the first token's log-probability, or a random key (unseeded samples would differ)."""
    engine = DisaggregatedEngine(model, backend="inprocess", **dict(OPTIONS, dtype=dtype))
    prompts, params = _workload()
    _add_all(engine, prompts, params)
    done = _finish_all(engine)
    assert {rid: _signature(out) for rid, out in done.items()} == _reference(model, dtype=dtype)
    stats = engine.stats()
    assert stats["disaggregated_prefill"]["handoffs"] == HANDED_OFF
    assert stats["prefix_cache_hits"] > 0  # the shared first block hit the prefill engine's cache
    decode_stats = stats["disaggregated_prefill"][DECODE]["stats"]
    assert decode_stats["prefix_cache_queries"] == 0  # the decode engine computed no prompt
    _check_pools_free(engine)


@pytest.mark.parametrize("model,options", [
    ("ouro-tiny", dict(async_scheduling=True)),
    ("ouro-tiny", dict(num_blocks=16, preemption_mode="swap")),
    pytest.param("ouro-tiny", dict(num_blocks=16, preemption_mode="recompute"), marks=pytest.mark.slow),
    ("ouro-tiny", dict(kv_cache_dtype="fp8")),
    pytest.param("huginn-tiny", dict(kv_layout="compress-s4"), marks=pytest.mark.slow),
], ids=["async", "swap", "recompute", "fp8-kv", "huginn-compressed-planes"])
def test_handoff_across_engine_settings(model, options):
    """With async scheduling (a step's results, the first token among them, arrive one step late),
    with a pool so small that the decode engine preempts handed-off requests (swap, or recompute
    from the imported tokens and depths), with FP8 planes (moved as bytes) and with Huginn's
    compressed plane layout, outputs still equal one engine's."""
    engine = DisaggregatedEngine(model, backend="inprocess", **dict(OPTIONS, **options))
    prompts, params = _workload()
    _add_all(engine, prompts, params)
    done = _finish_all(engine)
    assert {rid: _signature(out) for rid, out in done.items()} == _reference(model, **options)
    if "num_blocks" in options:
        assert engine.stats()["disaggregated_prefill"][DECODE]["stats"]["preemptions"] > 0
    _check_pools_free(engine)


@pytest.mark.parametrize("workload,backend", [("two requests", "inprocess"),
                                              pytest.param("full", "inprocess", marks=pytest.mark.slow),
                                              pytest.param("two requests", "process", marks=pytest.mark.slow)])
def test_tensor_parallel_engines_hand_off_bit_for_bit(workload, backend):
    """Both engines split over two gloo ranks: each prefill rank swaps out its heads, the handoff
    joins them along the K/V heads, and each decode rank takes its share back. Outputs equal one
    tensor-parallel engine's bit for bit and both pools end empty, with both engines in this process
    or each in its own (its ranks its children, the K/V over gloo). Catches heads joined or split in
    the wrong order (the decode ranks would attend over each other's heads)."""
    options = dict(OPTIONS, tensor_parallel_size=2)
    if workload == "full":
        prompts, params = _workload()
    else:
        prompts = [list(range(3, 23)), [7, 8, 9]]
        params = [SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True, exit_threshold=0.6),
                  SamplingParams(max_tokens=6, temperature=1.0, seed=4, logprobs=1, ignore_eos=True)]
    reference = LLMEngine("ouro-tiny", **options)
    try:
        _add_all(reference, prompts, params)
        expected = {rid: _signature(o) for rid, o in _finish_all(reference).items()}
    finally:
        reference.shutdown()
    engine = DisaggregatedEngine("ouro-tiny", backend=backend, **options)
    try:
        _add_all(engine, prompts, params)
        assert {rid: _signature(o) for rid, o in _finish_all(engine).items()} == expected
        assert engine.stats()["disaggregated_prefill"]["handoffs"] == (HANDED_OFF if workload == "full" else 2)
        if backend == "inprocess":
            _check_pools_free(engine)
    finally:
        ranks = [r["pid"] for w in engine.workers if backend == "inprocess"
                 for r in w.engine.executor.worker_processes()]
        engine.shutdown()
    assert len(ranks) == (4 if backend == "inprocess" else 0)
    assert not any(_alive(pid) for pid in ranks)  # shutdown stops both engines' ranks


@pytest.mark.parametrize("prefill_tp,decode_tp", [(1, 2), pytest.param(2, 1, marks=pytest.mark.slow)])
def test_engines_of_different_tensor_parallel_sizes_hand_off(prefill_tp, decode_tp):
    """A prefill engine of one size hands whole K/V heads to a decode engine of another, which cuts
    them into its own ranks' shares. Different reduction trees on the two sides make bitwise
    equality with any one engine impossible, so in fp64 the greedy tokens and exit depths must be
    one engine's (as tensor-parallel engines against the dense reference), both pools end empty and
    every rank stops. Catches a decode rank given another rank's heads, or all of them."""
    prompts = [list(range(3, 23)), [7, 8, 9], list(range(40, 75))]
    params = [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, exit_threshold=0.6),
              SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, exit_threshold=0.9)]
    expected = {rid: [(tokens, depths) for _, tokens, depths, *_ in sig[0]] for rid, sig in
                _reference("ouro-tiny", prompts, params, dtype="float64").items()}
    engine = DisaggregatedEngine("ouro-tiny", backend="inprocess", **dict(OPTIONS, dtype="float64"),
                                 prefill_tensor_parallel_size=prefill_tp, tensor_parallel_size=decode_tp)
    try:
        assert [w.engine.cfg.tensor_parallel_size for w in engine.workers] == [prefill_tp, decode_tp]
        _add_all(engine, prompts, params)
        done = _finish_all(engine)
        assert {rid: [(c.token_ids, c.exit_depths) for c in out.outputs] for rid, out in done.items()} == expected
        assert engine.stats()["disaggregated_prefill"]["handoffs"] == 3
        _check_pools_free(engine)
    finally:
        ranks = [r["pid"] for w in engine.workers for r in w.engine.executor.worker_processes()]
        engine.shutdown()
    assert len(ranks) == 2 and not any(_alive(pid) for pid in ranks)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"


def test_delta_outputs_add_up_to_one_engines_outputs():
    """The server reads deltas: merged back they equal one engine's whole outputs."""
    engine = DisaggregatedEngine("huginn-tiny", backend="inprocess", **OPTIONS)
    prompts, params = _workload()
    _add_all(engine, prompts, params)
    merged = {}
    while engine.has_unfinished_requests():
        for out in engine.step(deltas=True):
            merged.setdefault(out.request_id, OutputAccumulator()).add(out)
    assert {rid: _signature(acc.output) for rid, acc in merged.items()} == _reference("huginn-tiny")


def test_speculation_on_the_decode_engine_matches_one_speculative_engine():
    """Only the decode engine speculates; its rounds continue from the handed-off first token
    (a draft history not primed by the prefill row, or a wrong position, changes the outputs)."""
    engine = DisaggregatedEngine("ouro-tiny", backend="inprocess", speculative_config={"num_speculative_tokens": 2},
                                 **OPTIONS)
    assert engine.prefill.engine.policy is None and engine.decode.engine.policy is not None
    prompts, params = _workload()
    _add_all(engine, prompts, params)
    done = _finish_all(engine)
    expected = _reference("ouro-tiny", speculative_config={"num_speculative_tokens": 2})
    assert {rid: _signature(out) for rid, out in done.items()} == expected
    assert engine.stats()["speculative"]["rounds"] > 0
    _check_pools_free(engine)


def test_guided_requests_continue_their_grammar_on_the_decode_engine():
    """The decode engine's grammar matcher must have accepted the first token (replayed at import),
    else its masks would allow a second start of the pattern."""
    prompts = ["Pick", "Say"]
    params = [SamplingParams(max_tokens=8, temperature=0.9, seed=1, guided={"regex": "[ab]+c"}),
              SamplingParams(max_tokens=8, temperature=0, guided={"choice": ["yes", "no"]})]
    engine = DisaggregatedEngine("ouro-tiny", backend="inprocess", **OPTIONS)
    _add_all(engine, prompts, params)
    done = _finish_all(engine)
    assert {rid: _signature(out) for rid, out in done.items()} == _reference("ouro-tiny", prompts, params)
    assert engine.stats()["disaggregated_prefill"]["handoffs"] == 2
    _check_pools_free(engine)


# ---- aborts and failures ---------------------------------------------------------------------------------
def _roles(engine) -> dict:
    return {rid: t.role for rid, t in engine._tracked.items()}


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_aborts_free_blocks_on_both_engines_wherever_the_request_is(tp):
    """Abort during decode, during prefill, and between the two (exported by the prefill engine, not
    yet imported): every request ends "abort" and both pools return to their free count, with
    single-process engines and with tensor-parallel ones."""
    engine = DisaggregatedEngine("ouro-tiny", backend="inprocess", **dict(OPTIONS, max_num_batched_tokens=16,
                                                                        prefill_chunk_size=8, tensor_parallel_size=tp))
    try:
        _abort_everywhere(engine)
    finally:
        engine.shutdown()


def _abort_everywhere(engine) -> None:
    engine.add_request("dec", [1, 2, 3], LONG)
    while _roles(engine)["dec"] != DECODE:
        engine.step()
    engine.step()
    engine.add_request("pre", list(range(20, 60)), LONG)  # 40 tokens in chunks of 8: several prefill steps
    engine.step()
    assert _roles(engine) == {"dec": DECODE, "pre": PREFILL}
    assert engine.decode.engine.kv.pool.num_free < engine.decode.engine.kv.pool.num_blocks
    for rid in ("dec", "pre"):
        out = engine.abort_request(rid)
        assert out.finished and out.outputs[0].finish_reason == "abort", rid
    assert not engine.has_unfinished_requests() and engine.abort_request("dec") is None
    engine.add_request("transit", [4, 5, 6], LONG)
    while not engine.prefill._handoffs:  # step the prefill engine alone until it exports the request
        engine.prefill.poll(True)
    out = engine.abort_request("transit")
    assert out.finished and out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) == 1
    assert not engine.has_unfinished_requests()
    _check_pools_free(engine)


def test_a_failed_decode_engine_errors_every_request_and_frees_the_prefill_blocks():
    engine = DisaggregatedEngine("ouro-tiny", backend="inprocess", **dict(OPTIONS, max_num_batched_tokens=16,
                                                                        prefill_chunk_size=8))
    fail_after_steps(engine.decode.engine, 2)
    engine.add_request("a", [1, 2, 3], LONG)
    engine.add_request("b", list(range(20, 80)), LONG)  # still prefilling when the decode engine fails
    done = _finish_all(engine)
    for rid in ("a", "b"):
        assert done[rid].outputs[0].finish_reason == "error" and "decode engine" in done[rid].error
        assert "device lost" in done[rid].error
    assert 0 < len(done["a"].outputs[0].token_ids) < 30 and done["b"].outputs[0].token_ids == []
    pool = engine.prefill.engine.kv.pool
    assert pool.num_free == pool.num_blocks and not engine.prefill.engine.has_unfinished_requests()
    with pytest.raises(ReplicaError, match="decode engine"):
        engine.add_request("after", [1, 2, 3], LONG)


def test_a_failed_prefill_engine_errors_only_the_requests_it_holds():
    """Handed-off requests do not need the prefill engine any more: they decode to the end."""
    engine = DisaggregatedEngine("ouro-tiny", backend="inprocess", **dict(OPTIONS, max_num_batched_tokens=16,
                                                                        prefill_chunk_size=8))
    engine.add_request("handed", [1, 2, 3], LONG)
    while _roles(engine)["handed"] != DECODE:
        engine.step()
    engine.add_request("stuck", list(range(20, 80)), LONG)

    fail_after_steps(engine.prefill.engine, 0)
    done = _finish_all(engine)
    assert done["stuck"].outputs[0].finish_reason == "error" and "prefill engine" in done["stuck"].error
    assert done["handed"].error is None and len(done["handed"].outputs[0].token_ids) == 30
    assert done["handed"].outputs[0].token_ids == _reference("ouro-tiny", [[1, 2, 3]], [LONG])["q0"][0][0][1]
    pool = engine.decode.engine.kv.pool
    assert pool.num_free == pool.num_blocks
    with pytest.raises(ReplicaError, match="prefill engine"):
        engine.add_request("after", [1, 2, 3], LONG)


# ---- two processes, K/V over torch.distributed (gloo) ---------------------------------------------------
def _process_run(model: str):
    engine = build_engine(model, disaggregated_prefill=True, **OPTIONS)
    try:
        assert isinstance(engine, DisaggregatedEngine) and engine.prefill.pid != engine.decode.pid
        prompts, params = _workload()
        _add_all(engine, prompts, params)
        engine.add_request("abort-me", [1, 2, 3], LONG)
        done = {}
        while _roles(engine).get("abort-me") != DECODE:
            done.update((o.request_id, o) for o in engine.step() if o.finished)
        out = engine.abort_request("abort-me")  # across the pipe, on the decode engine
        assert out.finished and out.outputs[0].finish_reason == "abort"
        done.update(_finish_all(engine))
        done.pop("abort-me", None)
        assert {rid: _signature(o) for rid, o in done.items()} == _reference(model)
        for _ in range(50):  # the children send stats when they go idle
            stats = engine.stats()
            per = stats["disaggregated_prefill"]
            if per[PREFILL]["stats"].get("running") == 0 and per[DECODE]["stats"].get("running") == 0:
                break
            engine.step()
        assert per["handoffs"] == HANDED_OFF + 1
        assert per[PREFILL]["stats"]["kv_usage"] == 0.0 and per[DECODE]["stats"]["kv_usage"] == 0.0
    finally:
        engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_engine_processes_hand_off_over_gloo_bit_for_bit(model):
    """Two processes, the K/V over torch.distributed gloo: outputs equal one engine's, an abort
    during decode reaches the decode process, and both pools end empty."""
    _process_run(model)


def test_engine_processes_hand_off_over_gloo_one_request_each_way():
    """The representative of the two-process path left in the default run: a greedy early-exit
    request and a seeded sampled one cross gloo and equal one engine's outputs."""
    prompts = [list(range(3, 23)), [7, 8, 9]]
    params = [SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True, exit_threshold=0.6),
              SamplingParams(max_tokens=6, temperature=1.0, seed=4, logprobs=1, ignore_eos=True)]
    reference = LLMEngine("ouro-tiny", **OPTIONS)
    _add_all(reference, prompts, params)
    expected = {rid: _signature(o) for rid, o in _finish_all(reference).items()}
    engine = DisaggregatedEngine("ouro-tiny", **OPTIONS)
    try:
        _add_all(engine, prompts, params)
        assert {rid: _signature(o) for rid, o in _finish_all(engine).items()} == expected
        assert engine.stats()["disaggregated_prefill"]["handoffs"] == 2
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_an_engine_that_cannot_load_raises_its_own_error():
    message = r"the (prefill|decode) engine \(cpu\) failed to load: num_loops must be in 1\.\.8"
    with pytest.raises(ConfigError, match=message):
        DisaggregatedEngine("ouro-tiny", num_loops=9, **OPTIONS)
