"""FP8 weights (quantization="fp8"), FP8 weights and input rows (quantization="w8a8_fp8") and FP8
K/V (kv_cache_dtype="fp8") in the engine: storage, fidelity against the unquantized engine, batch
invariance, preemption and prefix caching."""

from __future__ import annotations

import pytest
import torch

from rlt_kernels.fp8 import FP8_DTYPE
from rlt_runtime import LLM, SamplingParams
from rlt_runtime.models.fp8_weights import Fp8Rows, Fp8Weight
from rlt_runtime.models.ouro import OuroModel
from workload import run_workload

PROMPTS = [list(range(5, 30)), [40, 41, 42], list(range(60, 95)), [7, 8, 9, 10, 11]]
TINY = dict(dtype="float32", max_num_seqs=4, block_size=16)
FP8 = dict(quantization="fp8", kv_cache_dtype="fp8")
W8A8 = dict(quantization="w8a8_fp8", kv_cache_dtype="fp8")
# Greedy tokens of the FP8 engine that must equal the fp32 engine's, position by position, on
# the random-init ouro-tiny at full depth (exit_threshold 1, the default) (measured: 58 of 64 with FP8 weights and
# K/V, 44 of 64 with W8A8 and FP8 K/V, whose input rows round to 3 mantissa bits too; a gate near its threshold
# flips exit depths, so runs with early exits agree less). A first divergence changes everything after it, so
# the bound is loose; a wrong scale or a garbled cache gives chance-level agreement (a few percent).
MIN_GREEDY_AGREEMENT = {"fp8": 0.75, "w8a8_fp8": 0.55}


def greedy(llm, prompts=PROMPTS, max_tokens=16, exit_threshold=0.6):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2, seed=3,
                            exit_threshold=exit_threshold)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].exit_depths,
             [(lp.logprob, sorted(lp.top.items())) for lp in o.outputs[0].logprobs]) for o in outs]


@pytest.mark.parametrize("options", [FP8, W8A8], ids=["fp8", "w8a8_fp8"])
def test_fp8_storage_and_fidelity(options):
    base = LLM("ouro-tiny", **TINY)
    fp8 = LLM("ouro-tiny", **TINY, **options)
    layer = fp8.engine.executor.worker.model.layers[0]
    for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
        assert isinstance(w, Fp8Weight) and w.data.dtype == FP8_DTYPE and w.scale.dtype == torch.float32
        assert w.w8a8 == (options["quantization"] == "w8a8_fp8")
    assert fp8.engine.executor.worker.model.lm_head.dtype == torch.float32  # embeddings and the head stay in the model dtype
    assert fp8.engine.executor.worker.runner.kv.k.dtype == FP8_DTYPE and fp8.engine.executor.worker.runner.kv.v.dtype == FP8_DTYPE
    # One byte an element: a block is a quarter of the fp32 engine's.
    assert fp8.engine.memory_plan.block_bytes * 4 == base.engine.memory_plan.block_bytes
    ours, theirs = greedy(fp8, exit_threshold=1.0), greedy(base, exit_threshold=1.0)  # full depth
    pairs = [(a, b) for o, t in zip(ours, theirs) for a, b in zip(o[0], t[0])]
    assert len(pairs) == 64
    assert sum(a == b for a, b in pairs) / len(pairs) >= MIN_GREEDY_AGREEMENT[options["quantization"]]


@pytest.mark.parametrize("quantization", [FP8, W8A8], ids=["fp8", "w8a8_fp8"])
@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_fp8_rows_do_not_depend_on_the_batch(model, quantization):
    """A request's tokens, depths and log-probabilities alone equal those it gets among others."""
    options = dict(TINY, **quantization)
    if model == "huginn-tiny":
        options.update(exit_mode="latent-diff", exit_criterion_threshold=1.2)
    llm = LLM(model, **options)
    together = greedy(llm, max_tokens=8)
    for i in (0, 3):
        assert greedy(llm, [PROMPTS[i]], max_tokens=8)[0] == together[i]


@pytest.mark.parametrize("quantization", [FP8, W8A8], ids=["fp8", "w8a8_fp8"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_fp8_preemption_and_prefix_caching_change_nothing(mode, quantization):
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, seed=5, logprobs=3, ignore_eos=True,
                            exit_threshold=0.6)

    def outputs(llm):
        done = run_workload(llm, [(p, i % 3) for i, p in enumerate(PROMPTS)], params)
        return {i: (c.token_ids, c.exit_depths, [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
                for i, c in done.items()}

    roomy = outputs(LLM("ouro-tiny", enable_prefix_caching=False, **TINY, **quantization))
    tight = LLM("ouro-tiny", num_blocks=16, preemption_mode=mode, enable_prefix_caching=False, **TINY, **quantization)
    assert outputs(tight) == roomy
    assert tight.engine.stats()["preemptions"] > 0
    if mode == "recompute":  # prefix caching: a second pass over the same prompts hits the cache
        cached = LLM("ouro-tiny", **TINY, **quantization)
        assert outputs(cached) == roomy
        assert outputs(cached) == roomy


def test_w8a8_norms_write_the_rows_the_layers_read(monkeypatch):
    """Ouro's norms write q/k/v's and gate/up's FP8 input rows; the same engine quantizing those
    inputs in the linear op instead (as o and down do) gives the same bits, and the rows reach the
    layers (a norm that skipped its FP8 output would leave them uninitialised)."""
    sampled = SamplingParams(max_tokens=6, temperature=0.8, seed=2, logprobs=2, ignore_eos=True, exit_threshold=0.6)

    def outputs(llm):
        outs = llm.generate(PROMPTS, sampled, use_tqdm=False)
        return greedy(llm) + [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outs]

    fused = LLM("ouro-tiny", **TINY, **W8A8)
    ops = fused.engine.executor.worker.ops
    linear, seen = ops.linear, []

    def spy(x, weight, **kwargs):
        seen.append(isinstance(x, Fp8Rows))
        return linear(x, weight, **kwargs)

    monkeypatch.setattr(ops, "linear", spy)
    expected = outputs(fused)
    assert any(seen) and not all(seen)  # q/k/v and gate/up read norm-written rows; the head and gate do not
    monkeypatch.setattr(OuroModel, "_layer_input", lambda self, h: None)
    assert outputs(LLM("ouro-tiny", **TINY, **W8A8)) == expected
