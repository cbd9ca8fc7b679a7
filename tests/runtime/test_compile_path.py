"""The compile path on CPU: the step programs traced whole by torch.compile (fullgraph, Inductor)
with the kernels as opaque custom ops (`opaque_ops`) give the eager engine's bits.

`execution_mode="compile"` itself needs CUDA (its CUDA-graph trees); here the same programs are
compiled without graphs, on the Triton interpreter's kernels."""

from __future__ import annotations

import pytest
import torch

from rlt_kernels._triton import interpreter_active
from rlt_runtime import LLM, SamplingParams
from rlt_runtime.executor.opaque_ops import opaque

# torch.compile of every step program under the interpreter takes 1.5-2 minutes a test: `pytest -m slow`.
pytestmark = [pytest.mark.skipif(not interpreter_active(), reason="CPU runs exercise the Triton path via the interpreter"),
              pytest.mark.slow]

PROMPTS = [[5, 7, 9], [6, 7, 9, 11], [7, 7, 9, 11, 13]]


def _outputs(compiled: bool, params: SamplingParams, programs: tuple, model: str = "ouro-tiny", **options):
    llm = LLM(model, max_num_seqs=4, attention_backend="triton", dtype="float32", **options)
    runner = llm.engine.executor.worker.runner
    if compiled:
        runner.ops = opaque(runner.ops)
        for owner, name in programs:
            target = runner if owner == "runner" else getattr(runner, owner)
            setattr(target, name, torch.compile(getattr(target, name), fullgraph=True, dynamic=False))
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].exit_depths,
             [(lp.logprob, sorted(lp.top.items())) for lp in o.outputs[0].logprobs or []]) for o in outs]


def test_compiled_step_programs_match_eager():
    """Prefill and decode programs: sampling, log-probabilities, early exit, LAST_EXITED copies."""
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=1, logprobs=2, exit_threshold=0.6, ignore_eos=True)
    options = dict(last_exited_reads="copy")
    programs = (("runner", "decode_program"), ("runner", "prefill_program"))
    assert _outputs(True, params, programs, **options) == _outputs(False, params, programs, **options)


def test_compiled_speculative_rounds_match_eager():
    """Round programs (drafts, verification, exact rejection sampling) compiled whole."""
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=2, ignore_eos=True)
    options = dict(speculative_config={"num_speculative_tokens": 2, "draft_loops": 2, "draft_policy": "fixed"})
    programs = (("spec", "round_program"),)
    assert _outputs(True, params, programs, **options) == _outputs(False, params, programs, **options)


def test_compiled_huginn_programs_match_eager():
    """Huginn: the counter-based initial-state noise (an opaque op: a compiled float64 erfinv rounds
    differently) and the latent-difference exit."""
    params = SamplingParams(max_tokens=4, temperature=0.8, seed=1, logprobs=1, ignore_eos=True)
    options = dict(model="huginn-tiny", exit_mode="latent-diff", exit_criterion_threshold=1.2)
    programs = (("runner", "decode_program"), ("runner", "prefill_program"))
    assert _outputs(True, params, programs, **options) == _outputs(False, params, programs, **options)


@pytest.mark.parametrize("quantization", ["fp8", "w8a8_fp8"])
def test_compiled_fp8_programs_match_eager(quantization):
    """FP8 weights and K/V through the opaque ops (weight, row and K/V scales as custom-op arguments;
    with W8A8 the norms' FP8 rows and the quantize_rows op)."""
    params = SamplingParams(max_tokens=4, temperature=0.8, seed=3, logprobs=1, exit_threshold=0.6, ignore_eos=True)
    options = dict(quantization=quantization, kv_cache_dtype="fp8")
    programs = (("runner", "decode_program"), ("runner", "prefill_program"))
    assert _outputs(True, params, programs, **options) == _outputs(False, params, programs, **options)
