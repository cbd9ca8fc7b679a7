"""rlt_kernels: Triton kernels for looped (recurrent-depth) language models.

Every kernel has a torch reference with the same signature in `rlt_kernels.reference`.
Public kernels (see docs/kernels.md):

    paged_attention        paged attention with loop-depth indirection and fixed-size split-KV
    rope_paged_attention   decode passes: RoPE, the K/V write and decode attention in one launch
    kv_scatter, rope_kv_scatter          masked K/V writes into paged caches (+ fused RoPE)
    gather_rows, scatter_rows, finalize_last_exited   routing between slot pools and batches
    cache_slots            tokens' cache slots in every plane, from the block tables
    linear                 batch-invariant GEMM (+ fused SwiGLU), device-side active-row count
    linear_residual_norm   a linear feeding residual_norm (split-K partials summed by the norm)
    rms_norm, residual_norm, swiglu, apply_rope       fused norms and activations
    quantize_rows          FP8 rows with one power-of-two scale each (W8A8 linear inputs)
    sample, filtered_probs, compute_logprobs          counter-based sampling
    accept_draft           fused speculative acceptance
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "paged_attention": "attention",
    "rope_paged_attention": "attention",
    "attention_workspace_size": "attention",
    "new_attention_workspace": "attention",
    "new_range_counters": "attention",
    "linear_config": "gemm",
    "kv_scatter": "kv_cache",
    "rope_kv_scatter": "kv_cache",
    "gather_rows": "routing",
    "scatter_rows": "routing",
    "finalize_last_exited": "routing",
    "cache_slots": "block_tables",
    "linear": "gemm",
    "linear_partials": "gemm",
    "linear_residual_norm": "linear_norm",
    "rms_norm": "norms",
    "quantize_rows": "fp8_rows",
    "residual_norm": "norms",
    "swiglu": "norms",
    "apply_rope": "norms",
    "rope_cos_sin": "norms",
    "sample": "sampling",
    "filtered_probs": "sampling",
    "compute_logprobs": "sampling",
    "accept_draft": "acceptance",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlt_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"rlt_kernels.{module}"), name)
    globals()[name] = value
    return value
