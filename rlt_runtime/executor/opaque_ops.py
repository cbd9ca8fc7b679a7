"""Kernels as opaque torch custom ops, for ``execution_mode="compile"``.

Left to itself, torch.compile traces into every Triton kernel the step programs launch: Inductor
recompiles the kernels from its own path and, when it cannot prove which arguments a kernel
writes, treats all of them as written (which it refuses for dtype views of the staging buffer).
Here each op of the backend namespace becomes one `torch.library.custom_op` that declares exactly
the tensors it writes. Outputs the caller leaves to the op are allocated before the call with the
shapes and dtypes the op would give them, so every custom op returns nothing; Inductor compiles
the torch code between the kernels and calls the kernels as they are.

`opaque(ops)` wraps a namespace from `select_ops`; the wrappers keep the op signatures.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Optional

import torch
from torch import Tensor

from rlt_kernels.fp8_rows import empty_rows

from ..models.fp8_weights import linear_operands, output_rows
from .ops import with_scales

_IMPLS: list[Callable] = []  # the wrapped backends' functions; custom ops receive an index


def _register(fn: Callable) -> int:
    _IMPLS.append(fn)
    return len(_IMPLS) - 1


def _no_output(*args, **kwargs) -> None:
    return None


def _op(name: str, mutates: tuple):
    """Define rlt::<name> from an annotated function and give it a fake kernel (no outputs)."""
    def wrap(fn):
        op = torch.library.custom_op(f"rlt::{name}", mutates_args=mutates)(fn)
        op.register_fake(_no_output)
        return op
    return wrap


@_op("linear", ("out",))
def _linear(impl: int, x: Tensor, weight: Tensor, out: Tensor, active_rows: Optional[Tensor],
            activation: Optional[str], weight_scale: Optional[Tensor], x_scale: Optional[Tensor]) -> None:
    _IMPLS[impl](x, weight, out=out, active_rows=active_rows, activation=activation,
                 **with_scales({}, weight_scale=weight_scale, x_scale=x_scale))


@_op("linear_residual_norm", ("residual_out", "normed_out", "normed_scale"))
def _linear_residual_norm(impl: int, x: Tensor, weight: Tensor, residual: Tensor, post_weight: Tensor,
                          next_weight: Optional[Tensor], eps: float, norm_mode: str, residual_out: Tensor,
                          normed_out: Optional[Tensor], active_rows: Optional[Tensor], weight_scale: Optional[Tensor],
                          x_scale: Optional[Tensor], normed_scale: Optional[Tensor]) -> None:
    _IMPLS[impl](x, weight, residual, post_weight, next_weight, eps, mode=norm_mode, residual_out=residual_out,
                 normed_out=normed_out, active_rows=active_rows,
                 **with_scales({}, weight_scale=weight_scale, x_scale=x_scale, normed_scale=normed_scale))


@_op("rms_norm", ("out", "out_scale"))
def _rms_norm(impl: int, x: Tensor, weight: Tensor, eps: float, out: Tensor, active_rows: Optional[Tensor],
              out_scale: Optional[Tensor]) -> None:
    _IMPLS[impl](x, weight, eps, out=out, active_rows=active_rows, **with_scales({}, out_scale=out_scale))


@_op("residual_norm", ("residual_out", "normed_out", "normed_scale"))
def _residual_norm(impl: int, sub: Tensor, residual: Tensor, post_weight: Tensor, next_weight: Optional[Tensor],
                   eps: float, norm_mode: str, residual_out: Tensor, normed_out: Optional[Tensor],
                   active_rows: Optional[Tensor], normed_scale: Optional[Tensor]) -> None:
    _IMPLS[impl](sub, residual, post_weight, next_weight, eps, mode=norm_mode, residual_out=residual_out,
                 normed_out=normed_out, active_rows=active_rows, **with_scales({}, normed_scale=normed_scale))


@_op("quantize_rows", ("out", "out_scale"))
def _quantize_rows(impl: int, x: Tensor, out: Tensor, out_scale: Tensor, active_rows: Optional[Tensor]) -> None:
    _IMPLS[impl](x, out=out, out_scale=out_scale, active_rows=active_rows)


@_op("rope_kv_scatter", ("k_cache", "v_cache", "q_out"))
def _rope_kv_scatter(impl: int, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cos_sin: Tensor, k_cache: Tensor,
                     v_cache: Tensor, slot_mapping: Tensor, style: str, q_bias: Optional[Tensor],
                     k_bias: Optional[Tensor], q_out: Tensor, active_rows: Optional[Tensor], k_scale: Optional[Tensor],
                     v_scale: Optional[Tensor]) -> None:
    scales = {} if k_scale is None else dict(k_scale=k_scale, v_scale=v_scale)
    _IMPLS[impl](q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, style=style, q_bias=q_bias,
                 k_bias=k_bias, q_out=q_out, active_rows=active_rows, **scales)


@_op("paged_attention", ("out", "workspace"))
def _paged_attention(impl: int, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
                     query_start_loc: Tensor, scale: Optional[float], out: Tensor, workspace: Optional[Tensor],
                     seq_slots: Optional[Tensor], query_depth: Optional[int], query_depths: Optional[Tensor],
                     key_depth: Optional[Tensor], plane_offset: int, plane_modulus: Optional[int],
                     active_seqs: Optional[Tensor], split_size: Optional[int], decode_from: Optional[int],
                     decode_froms: Optional[Tensor], k_scale: Optional[Tensor], v_scale: Optional[Tensor]) -> None:
    scales = {} if k_scale is None else dict(k_scale=k_scale, v_scale=v_scale)
    _IMPLS[impl](q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale=scale, out=out,
                 workspace=workspace, seq_slots=seq_slots, query_depth=query_depth if query_depths is None else query_depths,
                 key_depth=key_depth, plane_offset=plane_offset, plane_modulus=plane_modulus, active_seqs=active_seqs,
                 split_size=split_size, decode_from=decode_from if decode_froms is None else decode_froms, **scales)


@_op("rope_paged_attention", ("k_cache", "v_cache", "out", "workspace"))
def _rope_paged_attention(impl: int, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cos_sin: Tensor,
                          k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, block_tables: Tensor,
                          seq_lens: Tensor, query_start_loc: Tensor, style: str, q_bias: Optional[Tensor],
                          k_bias: Optional[Tensor], out: Tensor, workspace: Optional[Tensor],
                          seq_slots: Optional[Tensor], query_depth: Optional[int], query_depths: Optional[Tensor],
                          key_depth: Optional[Tensor], plane_offset: int, plane_modulus: Optional[int],
                          active_seqs: Optional[Tensor], split_size: Optional[int], k_scale: Optional[Tensor],
                          v_scale: Optional[Tensor]) -> None:
    scales = {} if k_scale is None else dict(k_scale=k_scale, v_scale=v_scale)
    _IMPLS[impl](q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, seq_lens, query_start_loc,
                 style=style, q_bias=q_bias, k_bias=k_bias, out=out, workspace=workspace, seq_slots=seq_slots,
                 query_depth=query_depth if query_depths is None else query_depths, key_depth=key_depth,
                 plane_offset=plane_offset, plane_modulus=plane_modulus, active_seqs=active_seqs, split_size=split_size,
                 **scales)


@_op("scatter_rows", ("dst",))
def _scatter_rows(impl: int, src: Tensor, index: Tensor, dst: Tensor, active_rows: Optional[Tensor]) -> None:
    _IMPLS[impl](src, index, dst, active_rows=active_rows)


@_op("sample", ("out",))
def _sample(impl: int, logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor, seeds: Tensor,
            positions: Tensor, stream: int, out: Tensor, active_rows: Optional[Tensor]) -> None:
    _IMPLS[impl](logits, temperature, top_k, top_p, min_p, seeds, positions, stream=stream, out=out,
                 active_rows=active_rows)


@_op("filtered_probs", ("out",))
def _filtered_probs(impl: int, logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor,
                    out: Tensor, active_rows: Optional[Tensor]) -> None:
    _IMPLS[impl](logits, temperature, top_k, top_p, min_p, out=out, active_rows=active_rows)


@_op("compute_logprobs", ("chosen", "top_ids", "top_logprobs"))
def _compute_logprobs(impl: int, logits: Tensor, tokens: Tensor, num_top: int, chosen: Tensor, top_ids: Tensor,
                      top_logprobs: Tensor) -> None:
    for dst, src in zip((chosen, top_ids, top_logprobs), _IMPLS[impl](logits, tokens, num_top)):
        dst.copy_(src)


@_op("accept_draft", ("out_tokens", "num_accepted"))
def _accept_draft(impl: int, draft_tokens: Tensor, num_drafts: Tensor, target_tokens: Tensor,
                  target_probs: Optional[Tensor], draft_probs: Optional[Tensor], greedy: Tensor, seeds: Tensor,
                  positions: Tensor, out_tokens: Tensor, num_accepted: Tensor, active_rows: Optional[Tensor]) -> None:
    _IMPLS[impl](draft_tokens, num_drafts, target_tokens, target_probs, draft_probs, greedy, seeds, positions,
                 out_tokens=out_tokens, num_accepted=num_accepted, active_rows=active_rows)


@_op("finalize_last_exited", ("k_cache", "v_cache"))
def _finalize_last_exited(impl: int, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_slots: Tensor,
                          positions: Tensor, exit_planes: Tensor, active_rows: Optional[Tensor]) -> None:
    _IMPLS[impl](k_cache, v_cache, block_tables, seq_slots, positions, exit_planes, active_rows=active_rows)


@_op("cache_slots", ("out",))
def _cache_slots(impl: int, block_tables: Tensor, token_slots: Tensor, positions: Tensor, block_size: int, out: Tensor,
                 active_rows: Optional[Tensor]) -> None:
    _IMPLS[impl](block_tables, token_slots, positions, block_size, out=out, active_rows=active_rows)


def opaque(ops: SimpleNamespace) -> SimpleNamespace:
    """The same namespace with every kernel called through its custom op (signatures unchanged)."""
    i = {name: _register(getattr(ops, name)) for name in (
        "linear", "linear_residual_norm", "rms_norm", "residual_norm", "quantize_rows", "rope_kv_scatter",
        "paged_attention",
        "rope_paged_attention", "scatter_rows", "sample", "filtered_probs", "compute_logprobs", "accept_draft", "finalize_last_exited",
        "cache_slots")}

    def quantize_rows(x, *, out=None, out_scale=None, active_rows=None):
        out, out_scale = empty_rows(x, out, out_scale)
        _quantize_rows(i["quantize_rows"], x, out, out_scale, active_rows)
        return out, out_scale

    def linear(x, weight, *, out=None, active_rows=None, activation=None):
        x, data, scale, x_scale, out_dtype = linear_operands(x, weight, quantize_rows, active_rows)
        n = weight.shape[0] // 2 if activation == "swiglu" else weight.shape[0]
        out = torch.empty((x.shape[0], n), dtype=out_dtype, device=x.device) if out is None else out
        _linear(i["linear"], x, data, out, active_rows, activation, scale, x_scale)
        return out

    def rms_norm(x, weight, eps, *, out=None, active_rows=None):
        out = torch.empty_like(x) if out is None else out
        data, scale = output_rows(out)
        _rms_norm(i["rms_norm"], x, weight, float(eps), data, active_rows, scale)
        return out

    def residual_norm(sub, residual, post_weight, next_weight, eps, *, mode="ouro", residual_out=None,
                      normed_out=None, active_rows=None):
        residual_out = torch.empty_like(residual) if residual_out is None else residual_out
        if next_weight is not None and normed_out is None:
            normed_out = torch.empty_like(sub)
        normed = normed_out if next_weight is not None else None
        data, scale = output_rows(normed)
        _residual_norm(i["residual_norm"], sub, residual, post_weight, next_weight, float(eps), mode, residual_out,
                       data, active_rows, scale)
        return residual_out, normed

    def linear_residual_norm(x, weight, residual, post_weight, next_weight, eps, *, mode="ouro", residual_out=None,
                             normed_out=None, active_rows=None):
        residual_out = torch.empty_like(residual) if residual_out is None else residual_out
        if next_weight is not None and normed_out is None:
            normed_out = torch.empty_like(residual)
        normed = normed_out if next_weight is not None else None
        x, data, scale, x_scale, _ = linear_operands(x, weight, quantize_rows, active_rows)
        normed_data, normed_scale = output_rows(normed)
        _linear_residual_norm(i["linear_residual_norm"], x, data, residual, post_weight, next_weight, float(eps), mode,
                              residual_out, normed_data, active_rows, scale, x_scale, normed_scale)
        return residual_out, normed

    def rope_kv_scatter(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, *, style="neox", q_bias=None,
                        k_bias=None, q_out=None, active_rows=None, k_scale=None, v_scale=None):
        q_out = torch.empty_like(q) if q_out is None else q_out
        _rope_kv_scatter(i["rope_kv_scatter"], q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, style,
                         q_bias, k_bias, q_out, active_rows, k_scale, v_scale)
        return q_out

    def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, *, scale=None, out=None,
                        workspace=None, seq_slots=None, query_depth=None, key_depth=None, plane_offset=0,
                        plane_modulus=None, active_seqs=None, split_size=None, decode_from=None, k_scale=None,
                        v_scale=None):
        out = torch.empty_like(q) if out is None else out
        tensor_depth = isinstance(query_depth, torch.Tensor)
        tensor_from = isinstance(decode_from, torch.Tensor)
        _paged_attention(i["paged_attention"], q, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
                         None if scale is None else float(scale), out, workspace, seq_slots,
                         None if tensor_depth or query_depth is None else int(query_depth),
                         query_depth if tensor_depth else None, key_depth, int(plane_offset),
                         None if plane_modulus is None else int(plane_modulus), active_seqs, split_size,
                         None if tensor_from or decode_from is None else int(decode_from),
                         decode_from if tensor_from else None, k_scale, v_scale)
        return out

    def rope_paged_attention(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping, block_tables, seq_lens,
                             query_start_loc, *, style="neox", q_bias=None, k_bias=None, out=None, workspace=None,
                             seq_slots=None, query_depth=None, key_depth=None, plane_offset=0, plane_modulus=None,
                             active_seqs=None, split_size=None, k_scale=None, v_scale=None):
        out = torch.empty_like(q) if out is None else out
        tensor_depth = isinstance(query_depth, torch.Tensor)
        _rope_paged_attention(i["rope_paged_attention"], q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping,
                              block_tables, seq_lens, query_start_loc, style, q_bias, k_bias, out, workspace, seq_slots,
                              None if tensor_depth or query_depth is None else int(query_depth),
                              query_depth if tensor_depth else None, key_depth, int(plane_offset),
                              None if plane_modulus is None else int(plane_modulus), active_seqs, split_size, k_scale,
                              v_scale)
        return out

    def scatter_rows(src, index, dst, *, active_rows=None):
        _scatter_rows(i["scatter_rows"], src, index, dst, active_rows)
        return dst

    def sample(logits, temperature, top_k, top_p, min_p, seeds, positions, *, stream=0, out=None, active_rows=None):
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device) if out is None else out
        _sample(i["sample"], logits, temperature, top_k, top_p, min_p, seeds, positions, int(stream), out, active_rows)
        return out

    def filtered_probs(logits, temperature, top_k, top_p, min_p, *, out=None, active_rows=None):
        if out is None:
            out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        _filtered_probs(i["filtered_probs"], logits, temperature, top_k, top_p, min_p, out, active_rows)
        return out

    def compute_logprobs(logits, tokens, num_top=0):
        m, dev = logits.shape[0], logits.device
        chosen = torch.empty(m, dtype=torch.float32, device=dev)
        top_ids = torch.empty((m, num_top), dtype=torch.int64, device=dev)
        top_lp = torch.empty((m, num_top), dtype=torch.float32, device=dev)
        _compute_logprobs(i["compute_logprobs"], logits, tokens, int(num_top), chosen, top_ids, top_lp)
        return chosen, top_ids, top_lp

    def accept_draft(draft_tokens, num_drafts, target_tokens, target_probs, draft_probs, greedy, seeds, positions, *,
                     out_tokens=None, num_accepted=None, active_rows=None):
        r, k = draft_tokens.shape
        if out_tokens is None:
            out_tokens = torch.empty((r, k + 1), dtype=torch.int64, device=draft_tokens.device)
        if num_accepted is None:
            num_accepted = torch.empty(r, dtype=torch.int32, device=draft_tokens.device)
        _accept_draft(i["accept_draft"], draft_tokens, num_drafts, target_tokens, target_probs, draft_probs, greedy,
                      seeds, positions, out_tokens, num_accepted, active_rows)
        return out_tokens, num_accepted

    def finalize_last_exited(k_cache, v_cache, block_tables, seq_slots, positions, exit_planes, *, active_rows=None):
        _finalize_last_exited(i["finalize_last_exited"], k_cache, v_cache, block_tables, seq_slots, positions,
                              exit_planes, active_rows)

    def cache_slots(block_tables, token_slots, positions, block_size, *, out=None, active_rows=None):
        if out is None:
            out = torch.empty((block_tables.shape[0], positions.shape[0]), dtype=torch.int64, device=positions.device)
        _cache_slots(i["cache_slots"], block_tables, token_slots, positions, int(block_size), out, active_rows)
        return out

    wrapped = dict(vars(ops))
    wrapped.update(linear=linear, linear_residual_norm=linear_residual_norm, rms_norm=rms_norm,
                   residual_norm=residual_norm, quantize_rows=quantize_rows, rope_kv_scatter=rope_kv_scatter,
                   paged_attention=paged_attention, rope_paged_attention=rope_paged_attention, scatter_rows=scatter_rows, sample=sample,
                   filtered_probs=filtered_probs, compute_logprobs=compute_logprobs, accept_draft=accept_draft,
                   finalize_last_exited=finalize_last_exited, cache_slots=cache_slots)
    return SimpleNamespace(**wrapped)
