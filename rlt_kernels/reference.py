"""Torch references of every rlt_kernels kernel, under the kernels' own names.

Same signatures and semantics as the Triton kernels; plain torch, any device, fp64 allowed.
Every reference is row-invariant (a row's bits do not depend on the rest of the batch), so
the runtime uses this module as its CPU backend and tests use it as the oracle.
"""

from .acceptance import accept_draft_reference as accept_draft
from .attention import paged_attention_reference as paged_attention
from .attention import rope_paged_attention_reference as rope_paged_attention
from .block_tables import cache_slots_reference as cache_slots
from .fp8_rows import quantize_rows_reference as quantize_rows
from .gemm import linear_reference as linear
from .kv_cache import kv_scatter_reference as kv_scatter
from .linear_norm import linear_residual_norm_reference as linear_residual_norm
from .kv_cache import rope_kv_scatter_reference as rope_kv_scatter
from .norms import apply_rope_reference as apply_rope
from .norms import residual_norm_reference as residual_norm
from .norms import rms_norm_reference as rms_norm
from .norms import swiglu_reference as swiglu
from .routing import finalize_last_exited_reference as finalize_last_exited
from .routing import gather_rows_reference as gather_rows
from .routing import scatter_rows_reference as scatter_rows
from .sampling import compute_logprobs_reference as compute_logprobs
from .sampling import filtered_probs_reference as filtered_probs
from .sampling import sample_reference as sample

__all__ = [
    "accept_draft", "paged_attention", "rope_paged_attention", "linear", "linear_residual_norm", "kv_scatter", "rope_kv_scatter", "apply_rope",
    "residual_norm", "rms_norm", "quantize_rows", "swiglu", "finalize_last_exited", "gather_rows", "scatter_rows", "cache_slots",
    "compute_logprobs", "filtered_probs", "sample",
]
