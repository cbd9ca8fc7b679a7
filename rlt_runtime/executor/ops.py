"""Kernel backend selection: Triton kernels on CUDA, their torch references on CPU.

Both namespaces expose the same functions with the same signatures (rlt_kernels' contract), so
the model code is backend-agnostic. An explicit `attention_backend` never falls back silently.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from ..errors import ConfigError
from ..models.fp8_weights import linear_operands, output_rows

OP_NAMES = (
    "linear", "linear_residual_norm", "rms_norm", "residual_norm", "quantize_rows", "swiglu", "apply_rope", "rope_kv_scatter",
    "kv_scatter", "paged_attention", "rope_paged_attention", "gather_rows", "scatter_rows", "sample", "filtered_probs", "compute_logprobs",
    "accept_draft", "finalize_last_exited", "cache_slots",
)
_MODULE_OF = {
    "linear": "gemm", "linear_residual_norm": "linear_norm", "rms_norm": "norms", "residual_norm": "norms", "quantize_rows": "fp8_rows", "swiglu": "norms", "apply_rope": "norms",
    "rope_kv_scatter": "kv_cache", "kv_scatter": "kv_cache", "paged_attention": "attention",
    "rope_paged_attention": "attention",
    "gather_rows": "routing", "scatter_rows": "routing", "finalize_last_exited": "routing", "cache_slots": "block_tables",
    "sample": "sampling", "filtered_probs": "sampling", "compute_logprobs": "sampling", "accept_draft": "acceptance",
}


def _triton_ops() -> dict:
    import importlib

    ops = {}
    for name in OP_NAMES:
        module = importlib.import_module(f"rlt_kernels.{_MODULE_OF[name]}")
        ops[name] = getattr(module, name)
    return ops


def _reference_ops() -> dict:
    import rlt_kernels.reference as ref

    return {name: getattr(ref, name) for name in OP_NAMES}


def cublas_linear(x, weight, *, out=None, active_rows=None, activation=None, weight_scale=None, x_scale=None):
    """`linear` through torch.matmul (cuBLAS): faster at some shapes, not batch invariant.

    Same signature as rlt_kernels.linear; computes every row (rows past the active count hold
    whatever their inputs give). An FP8 weight is widened to x's dtype for the product and the
    result scaled per output channel in fp32; FP8 rows are first widened to bf16 times their
    scales (exact).
    """
    if x_scale is not None:
        x = (x.float() * x_scale[:, None]).to(torch.bfloat16)
    if weight_scale is None:
        acc = torch.matmul(x, weight.t())
    else:
        acc = torch.matmul(x, weight.to(x.dtype).t()).float() * weight_scale
    if activation == "swiglu":
        f = weight.shape[0] // 2
        acc = torch.nn.functional.silu(acc[:, :f].float()) * acc[:, f:].float()
    if out is None:
        return acc.to(x.dtype)
    out.copy_(acc)
    return out


def accepting_fp8_forms(ops: dict) -> None:
    """Let the linear and norm ops take the models' FP8 forms (models/fp8_weights.py): an
    `Fp8Weight` as the weight, `Fp8Rows` as a linear's input or a norm's output. They reach the
    kernels as their tensors and scales; the norms then return the `Fp8Rows` they filled."""
    linear, linear_norm, rms, residual_norm, quantize = (
        ops["linear"], ops["linear_residual_norm"], ops["rms_norm"], ops["residual_norm"], ops["quantize_rows"])

    def fp8_linear(x, weight, *, out=None, active_rows=None, activation=None, **kwargs):
        x, weight, weight_scale, x_scale, out_dtype = linear_operands(x, weight, quantize, active_rows)
        if out is None and x_scale is not None:
            n = weight.shape[0] // 2 if activation == "swiglu" else weight.shape[0]
            out = torch.empty((x.shape[0], n), dtype=out_dtype, device=x.device)
        return linear(x, weight, out=out, active_rows=active_rows, activation=activation,
                      **with_scales(kwargs, weight_scale=weight_scale, x_scale=x_scale))

    def fp8_linear_residual_norm(x, weight, *args, normed_out=None, active_rows=None, **kwargs):
        x, weight, weight_scale, x_scale, _ = linear_operands(x, weight, quantize, active_rows)
        data, scale = output_rows(normed_out)
        r, n = linear_norm(x, weight, *args, normed_out=data, active_rows=active_rows,
                           **with_scales(kwargs, weight_scale=weight_scale, x_scale=x_scale, normed_scale=scale))
        return r, (normed_out if scale is not None else n)

    def fp8_rms_norm(x, weight, eps, *, out=None, **kwargs):
        data, scale = output_rows(out)
        result = rms(x, weight, eps, out=data, **with_scales(kwargs, out_scale=scale))
        return out if scale is not None else result

    def fp8_residual_norm(*args, normed_out=None, **kwargs):
        data, scale = output_rows(normed_out)
        r, n = residual_norm(*args, normed_out=data, **with_scales(kwargs, normed_scale=scale))
        return r, (normed_out if scale is not None else n)

    ops.update(linear=fp8_linear, linear_residual_norm=fp8_linear_residual_norm, rms_norm=fp8_rms_norm,
               residual_norm=fp8_residual_norm)


def with_scales(kwargs: dict, **scales) -> dict:
    """kwargs plus the scales that are set (16-bit calls pass none, so every backend keeps its signature)."""
    return {**kwargs, **{k: v for k, v in scales.items() if v is not None}}


def composed_linear_residual_norm(linear, residual_norm):
    """`linear_residual_norm` as its two ops one after the other (for a `linear` without a fused form)."""
    def call(x, weight, residual, post_weight, next_weight, eps, *, mode="ouro", residual_out=None, normed_out=None,
             active_rows=None, weight_scale=None, x_scale=None, normed_scale=None):
        sub = linear(x, weight, active_rows=active_rows, **with_scales({}, weight_scale=weight_scale, x_scale=x_scale))
        return residual_norm(sub, residual, post_weight, next_weight, eps, mode=mode, residual_out=residual_out,
                             normed_out=normed_out, active_rows=active_rows,
                             **with_scales({}, normed_scale=normed_scale))

    return call


def select_ops(device: torch.device, attention_backend: str, batch_invariant: bool = True) -> SimpleNamespace:
    """The op namespace for a device and attention backend ("auto", "triton", "flash", "torch").

    The backend picks the paged-attention implementation only; every other op runs Triton on CUDA
    (and under TRITON_INTERPRET=1 with "triton"/"flash") and its torch reference otherwise.

    batch_invariant=False swaps the linear layers to cuBLAS on CUDA (results then depend on the
    batch size); everything else is unchanged.
    """
    from rlt_kernels._triton import HAS_TRITON, interpreter_active

    on_cuda = device.type == "cuda"
    if attention_backend in ("triton", "flash") and not on_cuda and not interpreter_active():
        raise ConfigError(
            f"attention_backend={attention_backend!r} needs a CUDA device (or TRITON_INTERPRET=1 on CPU); "
            "use 'auto' or 'torch' on CPU"
        )
    use_triton = (on_cuda and HAS_TRITON) or attention_backend in ("triton", "flash")
    if on_cuda and not HAS_TRITON and attention_backend in ("auto", "triton", "flash"):
        if attention_backend != "auto":
            raise ConfigError(f"attention_backend={attention_backend!r} needs the 'triton' package")
    ops = _triton_ops() if use_triton else _reference_ops()
    if use_triton:  # split decode attention merges its key ranges in place (a namespace's calls share one stream)
        from rlt_kernels.attention import new_range_counters

        counters = new_range_counters(device)
        ops["paged_attention"] = functools.partial(ops["paged_attention"], range_counters=counters)
        ops["rope_paged_attention"] = functools.partial(ops["rope_paged_attention"], range_counters=counters)
    if attention_backend == "torch" and on_cuda:
        ops["paged_attention"] = _reference_ops()["paged_attention"]
    if attention_backend == "flash":
        from rlt_kernels import flash

        if not flash.flash_available():
            raise ConfigError("attention_backend='flash' needs flash-attn (pip install -e .[flash])")
        ops["paged_attention"] = flash.paged_attention
    if attention_backend in ("torch", "flash") and use_triton:  # no fused form: RoPE's kernel, then the backend's
        from rlt_kernels.attention import rope_then_attend

        ops["rope_paged_attention"] = rope_then_attend(ops["rope_kv_scatter"], ops["paged_attention"])
    if on_cuda and not batch_invariant:
        ops["linear"] = cublas_linear
        ops["linear_residual_norm"] = composed_linear_residual_norm(cublas_linear, ops["residual_norm"])
    accepting_fp8_forms(ops)
    return SimpleNamespace(backend="triton" if use_triton else "torch", attention=attention_backend, **ops)


def check_flash_setup(layout, device: torch.device, dtype: torch.dtype, block_size: int) -> None:
    """Raise ConfigError for engine settings attention_backend='flash' cannot run.

    FlashAttention reads one block-table plane per query (rlt_kernels.flash): a layout whose
    loops share planes without one plane per loop needs the key-depth indirection it lacks."""
    if layout.use_key_depth_reads:
        raise ConfigError(
            f"attention_backend='flash' reads one cache plane per loop; kv_layout={layout.name!r} keeps "
            f"{layout.core_planes} planes for {layout.depth} loops, which needs the key-depth reads "
            "(last_exited_reads='indirect') only the Triton kernel has: use kv_layout 'last_exited' (copy reads), "
            "'shared', compress-sN with one plane or one per loop, or attention_backend='triton'"
        )
    if device.type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
        raise ConfigError(f"attention_backend='flash' needs dtype 'bfloat16' or 'float16' on CUDA, got {dtype}")
    from rlt_kernels.flash import block_size_problem

    problem = block_size_problem(block_size)
    if problem:
        raise ConfigError(f"attention_backend='flash': {problem}; set block_size=256 or use attention_backend='triton'")
