"""Tensor parallelism on CPU: tensor_parallel_size=2 runs two worker processes over gloo, each with
half of every block's heads and MLP columns, and must give the dense reference's greedy tokens
(and exit depths) and outputs that do not depend on the batch a request shares."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from test_engine_reference import PROMPTS, SEED, check

from rlt_runtime import LLM, ConfigError, SamplingParams
from rlt_runtime.executor.worker import WorkerSpec
from rlt_runtime.models import build_model
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.models.tensor_parallel import (TensorParallel, check_tensor_parallel, move_model, shard_model,
                                               weight_tensors)

TP = dict(device="cpu", seed=0, tensor_parallel_size=2, max_num_seqs=4, enable_prefix_caching=False)


@pytest.fixture(scope="module")
def engines():
    """TP=2 engines by (preset, dtype, options), started once per module and stopped at its end."""
    made = {}

    def get(preset: str, dtype: str, **options) -> LLM:
        key = repr((preset, dtype, sorted(options.items())))
        if key not in made:
            made[key] = LLM(preset, dtype=dtype, **TP, **options)
        return made[key]

    yield get
    for llm in made.values():
        llm.engine.shutdown()


def test_ouro_fp32_greedy_matches_the_dense_reference(engines):
    llm = engines("ouro-tiny", "float32")
    check(llm, "ouro-tiny", PROMPTS[:3], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))


def test_outputs_do_not_depend_on_the_batch(engines):
    """A sampled request with log-probabilities alone and among others of other lengths: the same
    tokens, depths and log-probability bits (the rank-order sum is row-wise)."""
    llm = engines("ouro-tiny", "float32")
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=5, logprobs=2, ignore_eos=True)
    target = list(range(30, 47))
    alone = llm.generate([target], params, use_tqdm=False)[0].outputs[0]
    crowd = [list(range(60, 60 + n)) for n in (3, 25, 9)]
    others = SamplingParams(max_tokens=7, temperature=1.0, seed=9, ignore_eos=True)
    outs = llm.generate(crowd[:2] + [target] + crowd[2:], [others, others, params, others], use_tqdm=False)
    mixed = outs[2].outputs[0]
    assert (mixed.token_ids, mixed.exit_depths) == (alone.token_ids, alone.exit_depths)
    assert [(lp.logprob, lp.top) for lp in mixed.logprobs] == [(lp.logprob, lp.top) for lp in alone.logprobs]
    llm.engine.check_invariants()


@pytest.mark.slow
def test_ouro_fp64_early_exit_matches_the_reference(engines):
    """Exit decisions read the summed state: every rank must take the reference's exits."""
    llm = engines("ouro-tiny", "float64", exit_mode="ouro")
    params = SamplingParams(max_tokens=8, temperature=0, exit_threshold=0.55, ignore_eos=True)
    check(llm, "ouro-tiny", PROMPTS, params, mode="ouro", threshold=0.55, layout="last_exited")


@pytest.mark.slow
@pytest.mark.parametrize("mode,threshold", [("fixed", None), ("kl", 5e-4)])
def test_huginn_fp64_matches_the_reference(engines, mode, threshold):
    llm = engines("huginn-tiny", "float64", exit_mode=mode, exit_criterion_threshold=threshold)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, seed=SEED)
    check(llm, "huginn-tiny", PROMPTS[:3], params, mode=mode, threshold=threshold, layout="last_exited")


@pytest.mark.slow
@pytest.mark.parametrize("preset,layout,ref_layout,mode,threshold", [
    ("ouro-tiny", "shared", "shared", "ouro", 0.55),
    ("huginn-tiny", "compress-s2", "compress-s2", "latent-diff", 1.2),
    ("huginn-tiny", "shared", "compress-s2", "kl", 1.0),
], ids=["ouro-shared", "huginn-compress-s2", "huginn-shared"])
def test_other_kv_layouts_match_the_reference(engines, preset, layout, ref_layout, mode, threshold):
    """Each rank's planes hold its heads in the plane-sharing and compressed layouts too: fp64
    greedy tokens and exit depths equal the dense reference's (as test_engine_reference checks
    one engine)."""
    llm = engines(preset, "float64", kv_layout=layout, exit_mode=mode, exit_criterion_threshold=None
                  if preset == "ouro-tiny" else threshold)
    exit_threshold = {"exit_threshold": threshold} if preset == "ouro-tiny" else {}
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, seed=SEED, **exit_threshold)
    check(llm, preset, PROMPTS[:3], params, mode=mode, threshold=threshold, layout=ref_layout)


@pytest.mark.slow
def test_fp8_weights_and_kv_give_one_fp8_engines_tokens(engines):
    """FP8 weights (per-channel scales sharded with their rows) and FP8 K/V planes (per-head
    scales with their heads): greedy tokens and exit depths of one engine with the same options."""
    options = dict(quantization="fp8", kv_cache_dtype="fp8", exit_mode="ouro")
    params = SamplingParams(max_tokens=8, temperature=0, exit_threshold=0.55, ignore_eos=True)
    one = LLM("ouro-tiny", dtype="float32", **dict(TP, tensor_parallel_size=1), **options)
    expected = [(o.outputs[0].token_ids, o.outputs[0].exit_depths) for o in one.generate(PROMPTS, params, use_tqdm=False)]
    got = engines("ouro-tiny", "float32", **options).generate(PROMPTS, params, use_tqdm=False)
    assert [(o.outputs[0].token_ids, o.outputs[0].exit_depths) for o in got] == expected


@pytest.mark.slow
def test_swap_preemption_speculation_and_async_steps_change_no_output(engines):
    """Swapped K/V stays with each rank under its swap id; a speculative round runs the same sums;
    overlapping steps (async scheduling) read the ranks' replies in order."""
    from test_preemption_outputs import outputs

    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=5, logprobs=3, ignore_eos=True,
                            exit_threshold=0.6)
    roomy = outputs(engines("ouro-tiny", "float32", block_size=16), params)
    tight = engines("ouro-tiny", "float32", block_size=16, num_blocks=16, preemption_mode="swap")
    assert outputs(tight, params) == roomy
    assert tight.engine.stats()["preemptions"] > 0
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    plain = engines("ouro-tiny", "float32").generate(PROMPTS, greedy, use_tqdm=False)
    spec = engines("ouro-tiny", "float32", speculative_config={"num_speculative_tokens": 2, "draft_policy": "fixed"})
    drafted = spec.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, speculative=True),
                            use_tqdm=False)
    assert [o.outputs[0].token_ids for o in drafted] == [o.outputs[0].token_ids for o in plain]
    assert spec.engine.stats()["speculative"]["rounds"] > 0
    overlapped = engines("ouro-tiny", "float32", async_scheduling=True).generate(PROMPTS, greedy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in overlapped] == [o.outputs[0].token_ids for o in plain]


def test_guided_speculation_sends_the_drafts_to_the_engine_and_the_masks_to_every_rank(engines):
    """A round with guided rows drafting is two calls (rank 0 answers "execute" with the drafts,
    every rank reads the masks inside the step): the tokens of guided decoding without
    speculation, grammar-valid, with drafts accepted."""
    pytest.importorskip("xgrammar")
    regex = "[a-c]{2}-[0-9]{2}"
    params = SamplingParams(max_tokens=16, temperature=0, guided={"regex": regex})
    plain = engines("ouro-tiny", "float32").generate(PROMPTS[:3], params, use_tqdm=False)
    spec = engines("ouro-tiny", "float32", async_scheduling=True,
                   speculative_config={"num_speculative_tokens": 3, "draft_loops": 1, "draft_policy": "fixed"})
    drafted = spec.generate(PROMPTS[:3], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in drafted] == [o.outputs[0].token_ids for o in plain]
    assert all(re.fullmatch(regex, o.outputs[0].text) for o in drafted)
    assert spec.engine.stats()["speculative"]["accepted"] > 0


def test_async_guided_steps_send_their_late_masks_after_the_step(engines):
    """Without speculation an async decode step after a guided step gets its guided rows' masks
    late (`late_masks`): the tensor-parallel executor sends the step first and the masks, built
    while the ranks run its forward, as the next call, beside guided prompts sampling in the same
    step (staggered arrivals): the outputs of synchronous steps."""
    pytest.importorskip("xgrammar")
    from test_logit_processing import _drive

    guided = SamplingParams(max_tokens=10, temperature=0.9, seed=2, logprobs=1, guided={"regex": "[a-c]{2}-[0-9]{2}"})
    work = [(PROMPTS[0], guided, 0), (PROMPTS[1], guided, 2), (PROMPTS[2], guided, 3)]
    sync = _drive(engines("ouro-tiny", "float32"), work)
    llm = engines("ouro-tiny", "float32", async_scheduling=True)
    eng, sent_first = llm.engine, []
    build = eng._late_masks

    def late_masks(*args):  # the step's "execute" is already on its way to the ranks
        sent_first.append(eng.executor._sent - 1 in eng.executor._unread)
        return build(*args)

    eng._late_masks = late_masks
    try:
        assert _drive(llm, work) == sync
    finally:
        del eng._late_masks
    assert sent_first and all(sent_first)


@pytest.mark.slow
def test_late_masks_that_cannot_be_built_fail_the_group():
    """The ranks wait inside the step for its masks: when the engine cannot build them, the step
    raises and so does every later call (nothing else may be read as the masks)."""
    pytest.importorskip("xgrammar")
    llm = LLM("ouro-tiny", dtype="float32", async_scheduling=True, **TP)
    eng = llm.engine

    def broken(*args):
        raise ValueError("no grammar today")

    eng._late_masks = broken
    try:
        eng.add_request("g", PROMPTS[0], SamplingParams(max_tokens=6, guided={"regex": "[a-c]{4}"}))
        with pytest.raises(ValueError, match="no grammar today"):
            for _ in range(10):
                eng.step()
        with pytest.raises(RuntimeError, match="late masks could not be built .*no grammar today"):
            eng.step()
    finally:
        eng.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["ouro-tiny", "huginn-tiny"])
def test_four_ranks_give_one_engines_greedy_tokens(tmp_path, preset):
    """tensor_parallel_size=4 (one K/V head per rank, a quarter of the MLP columns each) on a tiny
    checkpoint with four K/V heads: the greedy tokens and exit depths of one engine on the same
    checkpoint, in fp32, with early exit."""
    from rlt_runtime.models.checkpoint import save_checkpoint

    cfg = dataclasses.replace(preset_config(preset), num_key_value_heads=4)
    save_checkpoint(str(tmp_path), cfg, dict(preset_weights(cfg, seed=0)))
    options = dict(dtype="float32", device="cpu", max_num_seqs=4, enable_prefix_caching=False)
    if preset == "ouro-tiny":
        params = SamplingParams(max_tokens=8, temperature=0, exit_threshold=0.55, ignore_eos=True)
    else:
        options.update(exit_mode="latent-diff", exit_criterion_threshold=1.2)
        params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    runs = []
    for size in (1, 4):
        llm = LLM(str(tmp_path), tensor_parallel_size=size, **options)
        try:
            assert len(llm.engine.executor.worker_processes()) == (size if size > 1 else 0)
            outs = llm.generate(PROMPTS[:3], params, use_tqdm=False)
            runs.append([(o.outputs[0].token_ids, o.outputs[0].exit_depths) for o in outs])
        finally:
            llm.engine.shutdown()
    assert runs[0] == runs[1]


def test_shards_partition_every_block():
    """Rank 0 and rank 1 shards, put back together, are the full weights (q, k, v rows by head,
    o and down columns, gate and up rows by MLP column, Huginn's q/k biases by head)."""
    for preset in ("ouro-tiny", "huginn-tiny"):
        cfg = preset_config(preset)
        full, shards = None, []
        for rank in (None, 0, 1):
            model = build_model(cfg, None, "cpu", torch.float32)
            model.load_weights(preset_weights(cfg, seed=0, device="cpu", dtype=torch.float32))
            if rank is None:
                full = model
            else:
                shard_model(model, TensorParallel(rank, 2))
                shards.append(model)
        h, kvh, d, f = cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate_size
        assert [(m.heads, m.kv_heads) for m in shards] == [(h // 2, kvh // 2)] * 2
        names = ("wqkv", "wo", "w_gate_up", "w_down") if cfg.family == "ouro" else ("wqkv", "proj", "fc", "mlp_proj")
        blocks = (lambda m: m.layers) if cfg.family == "ouro" else (lambda m: m.prelude + m.core + m.coda_blocks)
        for i, block in enumerate(blocks(full)):
            a, b = blocks(shards[0])[i], blocks(shards[1])[i]
            qkv, out, gate_up, down = (getattr(block, n) for n in names)
            split = lambda w, sizes: torch.split(w, sizes)  # noqa: E731
            qa, ka, va = split(getattr(a, names[0]), [h // 2 * d, kvh // 2 * d, kvh // 2 * d])
            qb, kb, vb = split(getattr(b, names[0]), [h // 2 * d, kvh // 2 * d, kvh // 2 * d])
            assert torch.equal(torch.cat([qa, qb, ka, kb, va, vb]), qkv)
            assert torch.equal(torch.cat([getattr(a, names[1]), getattr(b, names[1])], dim=1), out)
            ga, ua = split(getattr(a, names[2]), [f // 2, f // 2])
            gb, ub = split(getattr(b, names[2]), [f // 2, f // 2])
            assert torch.equal(torch.cat([ga, gb, ua, ub]), gate_up)
            assert torch.equal(torch.cat([getattr(a, names[3]), getattr(b, names[3])], dim=1), down)
            if cfg.family == "huginn" and cfg.qk_bias:
                assert torch.equal(torch.cat([a.q_bias, b.q_bias]), block.q_bias)
                assert torch.equal(torch.cat([a.k_bias, b.k_bias]), block.k_bias)


@pytest.mark.parametrize("preset,quantization", [("ouro-tiny", None), ("huginn-tiny", "fp8")])
def test_a_shard_moves_to_its_device_whole(preset, quantization):
    """Every weight a rank keeps reaches its device (the rank loads and slices on the CPU)."""
    cfg = preset_config(preset)
    model = build_model(cfg, None, "cpu", torch.float32, quantization)
    model.load_weights(preset_weights(cfg, seed=0, device="cpu", dtype=torch.float32))
    shard_model(model, TensorParallel(1, 2))
    move_model(model, "meta")
    tensors = weight_tensors(model)
    assert len(tensors) > 10 and all(t.device.type == "meta" for t in tensors)
    assert model.device.type == "meta"


def test_sizes_that_do_not_divide_the_model_are_config_errors():
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=3 must divide the model's attention heads \(4\)"):
        LLM("ouro-tiny", device="cpu", dtype="float32", tensor_parallel_size=3)
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=4 must divide the model's key/value heads \(2\)"):
        LLM("huginn-tiny", device="cpu", dtype="float32", tensor_parallel_size=4)
    wide = dataclasses.replace(preset_config("ouro-tiny"), intermediate_size=129)
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 must divide the model's MLP width .*\(129\)"):
        check_tensor_parallel(wide, 2)


def test_more_ranks_than_gpus_is_a_config_error(monkeypatch):
    from rlt_runtime.executor.multiproc import MultiprocExecutor

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    fields = {f.name: None for f in dataclasses.fields(WorkerSpec)}
    spec = WorkerSpec(**{**fields, "model_config": preset_config("ouro-tiny"), "device": "cuda"})
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 on cuda needs cuda:0..cuda:1 but 1 GPUs are visible"):
        MultiprocExecutor(spec, 2)
