"""An engine whose decode attention splits its keys into ranges gives the tokens, exit depths and
log-probabilities of the same engine whose attention never splits: on the CPU through the Triton
interpreter (eager), on a GPU with graphs and async scheduling. 64-key ranges, so prompts of 62
tokens and more reach a second range while they decode; range programs that take one, two or all
of a row's ranges (`rlt_kernels.attention._decode_range_programs`), merged in place."""

from __future__ import annotations

import pytest
import torch

import rlt_kernels.attention as attn
from rlt_kernels._triton import interpreter_active
from rlt_runtime import LLM, SamplingParams
from rlt_runtime.executor import ops as ops_module

PARAMS = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, exit_threshold=0.6, logprobs=2)


def _prompts(n: int, shortest: int, step: int) -> list[list[int]]:
    return [[(7 * i + j) % 200 + 3 for j in range(shortest + step * i)] for i in range(n)]


def _outputs(llm: LLM, prompts) -> list:
    return [(c.token_ids, c.exit_depths, [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
            for o in llm.generate(prompts, PARAMS, use_tqdm=False) for c in o.outputs]


def _split_and_unsplit(monkeypatch, programs: int, make_llm, prompts, one_engine: bool) -> list:
    """Outputs with no attention launch split, then with every launch split; `programs` range
    programs per row at most. one_engine: both runs on one eager engine (the second finds the
    prompts in the prefix cache); else an engine per run, built and its graphs captured under the
    run's rule."""
    monkeypatch.setattr(attn, "DEFAULT_SPLIT_SIZE", 64)
    monkeypatch.setattr(attn, "_decode_range_programs", lambda rows, n, dev: min(n, programs))
    outs, llm = [], None
    for split in (False, True):
        monkeypatch.setattr(attn, "_should_split", lambda *a, split=split: split)
        llm = llm if one_engine and llm is not None else make_llm()
        outs.append(_outputs(llm, prompts))
    return outs


@pytest.mark.skipif(not interpreter_active(), reason="CPU runs exercise the Triton path via the interpreter")
def test_split_decode_attention_in_the_engine_interpreted(monkeypatch):
    # Only the decode attention (the kernel that splits) runs interpreted; every other op is its
    # torch reference, which keeps the interpreter's per-program cost off the prompts' tokens.
    monkeypatch.setattr(ops_module, "_triton_ops", lambda: {
        **ops_module._reference_ops(), "rope_paged_attention": attn.rope_paged_attention})
    unsplit, split = _split_and_unsplit(
        monkeypatch, 1, lambda: LLM("ouro-tiny", dtype="float32", max_num_seqs=4, attention_backend="triton",
                                    exit_mode="ouro"), _prompts(2, 62, 8), one_engine=True)
    assert split == unsplit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("programs", [1, 3])
def test_split_decode_attention_in_the_engine_on_gpu(monkeypatch, programs):
    unsplit, split = _split_and_unsplit(
        monkeypatch, programs, lambda: LLM("ouro-tiny", dtype="bfloat16", max_num_seqs=24, exit_mode="ouro",
                                           cuda_graph_sizes=[8, 24], gpu_memory_utilization=0.08),
        _prompts(24, 40, 9), one_engine=False)
    assert split == unsplit
