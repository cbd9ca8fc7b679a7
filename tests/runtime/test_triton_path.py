"""The runtime on its Triton kernels (interpreter on CPU) equals the runtime on the torch references."""

from __future__ import annotations

import pytest

from rlt_kernels._triton import interpreter_active
from rlt_runtime import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="CPU runs exercise the Triton path via the interpreter")

PROMPTS = [list(range(5, 22)), [40, 41, 42]]


@pytest.mark.parametrize("model,options,temperature", [
    ("huginn-tiny", {"exit_mode": "latent-diff", "exit_criterion_threshold": 1.2}, 0.8),
    pytest.param("ouro-tiny", {"speculative_config": {"num_speculative_tokens": 2, "draft_loops": 1,
                                                      "draft_policy": "fixed"}, "exit_mode": "ouro"}, 0.8,
                 marks=pytest.mark.slow),  # ~26 s; the acceptance kernel runs unmarked in tests/kernels/test_acceptance.py
    pytest.param("ouro-tiny", {"quantization": "fp8", "kv_cache_dtype": "fp8", "exit_mode": "ouro"}, 0.8,
                 marks=pytest.mark.slow),  # FP8 weights and K/V: ~80 s under the interpreter
])
def test_triton_kernels_match_torch_references_end_to_end(model, options, temperature):
    params = SamplingParams(max_tokens=4, temperature=temperature, seed=3, ignore_eos=True, exit_threshold=0.6,
                            logprobs=2)
    outs = []
    for backend in ("torch", "triton"):
        llm = LLM(model, dtype="float32", max_num_seqs=2, attention_backend=backend, **options)
        assert llm.engine.executor.worker.ops.backend == backend
        outs.append([(o.outputs[0].token_ids, o.outputs[0].exit_depths) for o in llm.generate(PROMPTS, params, use_tqdm=False)])
    assert outs[0] == outs[1]


def test_split_decode_attention_in_the_engine(monkeypatch):
    """Decode steps whose attention splits the keys into several ranges, with one range program
    per row taking them all (the last to finish merges in place), give the tokens, depths and
    log-probabilities of the same engine whose attention never splits. 64-key ranges, so the
    prompts of 62 and 70 tokens reach a second range while they decode."""
    import rlt_kernels.attention as attn

    monkeypatch.setattr(attn, "DEFAULT_SPLIT_SIZE", 64)
    prompts = [[(7 * i + j) % 200 + 3 for j in range(62 + 8 * i)] for i in range(2)]
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, exit_threshold=0.6, logprobs=2)
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, attention_backend="triton", exit_mode="ouro")
    monkeypatch.setattr(attn, "_decode_range_programs", lambda rows, n, dev: 1)
    outs = []
    for split in (False, True):  # the second run finds the prompts' blocks in the prefix cache
        monkeypatch.setattr(attn, "_should_split", lambda *a, split=split: split)
        outs.append([(c.token_ids, c.exit_depths, [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
                     for o in llm.generate(prompts, params, use_tqdm=False) for c in o.outputs])
    assert outs[1] == outs[0]
