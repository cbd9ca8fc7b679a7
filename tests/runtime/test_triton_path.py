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
    pytest.param("ouro-tiny", {"quantization": "w8a8_fp8", "exit_mode": "ouro"}, 0.8,
                 marks=pytest.mark.slow),  # W8A8: FP8 rows written by the norms and by quantize_rows
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

