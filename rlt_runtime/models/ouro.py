"""Ouro as stage functions: embed, one loop (all layers + final norm), exit gate, LM head.

Math (reference/MODELS.md §1.3): each layer is
    x = x + rms(attn(rms(x; input_layernorm)); input_layernorm_2)
    x = x + rms(mlp(rms(x; post_attention_layernorm)); post_attention_layernorm_2)
and after the last layer of every loop `model.norm` is applied; that normed state is both the
next loop's input and what the exit gate and the LM head read. q/k/v and gate/up are fused at
load time; the norm → residual-add → next-norm chain is one fused kernel per sublayer. With
quantization="w8a8_fp8" the norms before q/k/v and gate/up write their rows as FP8 for those
layers (`Fp8Rows`); o and down quantize their inputs themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from ..cache.layout import KVLayout
from .configs import OuroConfig, check_weight_names, check_weights_complete, hf_weight_shapes
from .exit_rules import GATE_MODES, ExitRule, ExitState, lookahead_logits, new_exit_state, ouro_exit
from .fp8_weights import Fp8Rows, linear_weight
from .tensor_parallel import RankSlices, row_parallel_residual_norm
from .weight_update import Target


@dataclass
class OuroLayer:
    """Linear weights are tensors, or `Fp8Weight`s with quantization "fp8" or "w8a8_fp8"."""

    wqkv: torch.Tensor  # [(H + 2 KVH) * D, hidden]
    wo: torch.Tensor  # [hidden, H * D]
    w_gate_up: torch.Tensor  # [2F, hidden]
    w_down: torch.Tensor  # [hidden, F]
    input_norm: torch.Tensor
    input_norm_2: torch.Tensor
    post_norm: torch.Tensor
    post_norm_2: torch.Tensor


class OuroModel:
    """Ouro weights on one device plus its stage functions (see module docstring); the runner
    drives it through the `LoopedModel` members (models/looped.py)."""

    rope_style = "neox"
    random_initial_state = False  # loops start from the embedding
    head_input_attends = False  # the head reads the last loop's normed state

    def __init__(self, config: OuroConfig, layout: KVLayout, device, dtype, quantization=None):
        self.config, self.layout, self.device, self.dtype = config, layout, torch.device(device), dtype
        self.quantization = quantization  # None, "fp8" or "w8a8_fp8": how the layers' linear layers are stored
        self.layers: list[OuroLayer] = []
        self._layers: dict[int, OuroLayer] = {}
        self.embed_tokens = self.norm = self.gate_w = self.gate_b = self.lm_head = None
        # This rank's attention heads and the group summing the partial outputs of the o and down
        # projections (models/tensor_parallel.py); all heads and None without tensor parallelism.
        self.heads, self.kv_heads, self.tp = config.num_attention_heads, config.num_key_value_heads, None

    # ---- loading -----------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Consume (hf_name, tensor) pairs one at a time, fusing q/k/v and gate/up."""
        cfg = self.config
        expected = hf_weight_shapes(cfg)
        seen: dict[str, torch.Tensor] = {}
        pending: dict[int, dict[str, torch.Tensor]] = {}
        for name, tensor in weights:
            check_weight_names([name], expected, "Ouro")
            t = tensor.to(self.device, self.dtype)
            seen[name] = t
            if name.startswith("model.layers."):
                idx = int(name.split(".")[2])
                pending.setdefault(idx, {})[name.split(".", 3)[3]] = t
                if len(pending[idx]) == 11:
                    self._set_layer(idx, pending.pop(idx))
        check_weights_complete(seen, expected, "Ouro")
        self.embed_tokens = seen["model.embed_tokens.weight"]
        self.norm = seen["model.norm.weight"]
        self.gate_w = seen["model.early_exit_gate.weight"]
        self.gate_b = seen["model.early_exit_gate.bias"].float()
        self.lm_head = seen["lm_head.weight"]
        self.layers = [self._layers.pop(i) for i in range(cfg.num_hidden_layers)]

    def _set_layer(self, idx: int, p: dict[str, torch.Tensor]) -> None:
        q = self.quantization
        self._layers[idx] = OuroLayer(
            wqkv=linear_weight(torch.cat([p["self_attn.q_proj.weight"], p["self_attn.k_proj.weight"],
                                          p["self_attn.v_proj.weight"]]), q),
            wo=linear_weight(p["self_attn.o_proj.weight"], q),
            w_gate_up=linear_weight(torch.cat([p["mlp.gate_proj.weight"], p["mlp.up_proj.weight"]]), q),
            w_down=linear_weight(p["mlp.down_proj.weight"], q),
            input_norm=p["input_layernorm.weight"],
            input_norm_2=p["input_layernorm_2.weight"],
            post_norm=p["post_attention_layernorm.weight"],
            post_norm_2=p["post_attention_layernorm_2.weight"],
        )

    def weight_targets(self) -> dict[str, tuple[Target, ...]]:
        """Where each checkpoint tensor lives in this loaded model (this rank's shard): q/k/v rows of
        wqkv, gate/up rows of w_gate_up, o and down columns (models/weight_update.py)."""
        cfg = self.config
        keep = RankSlices.of(self.tp, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                             cfg.intermediate_size)
        q, kv, f = (b - a for a, b in (keep.q, keep.kv, keep.mlp))
        targets = {"model.embed_tokens.weight": (Target(self.embed_tokens),), "model.norm.weight": (Target(self.norm),),
                   "model.early_exit_gate.weight": (Target(self.gate_w),),
                   "model.early_exit_gate.bias": (Target(self.gate_b),), "lm_head.weight": (Target(self.lm_head),)}
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            targets.update({
                p + "self_attn.q_proj.weight": (Target(layer.wqkv, rows=keep.q),),
                p + "self_attn.k_proj.weight": (Target(layer.wqkv, rows=keep.kv, at=q),),
                p + "self_attn.v_proj.weight": (Target(layer.wqkv, rows=keep.kv, at=q + kv),),
                p + "self_attn.o_proj.weight": (Target(layer.wo, cols=keep.q),),
                p + "mlp.gate_proj.weight": (Target(layer.w_gate_up, rows=keep.mlp),),
                p + "mlp.up_proj.weight": (Target(layer.w_gate_up, rows=keep.mlp, at=f),),
                p + "mlp.down_proj.weight": (Target(layer.w_down, cols=keep.mlp),),
                p + "input_layernorm.weight": (Target(layer.input_norm),),
                p + "input_layernorm_2.weight": (Target(layer.input_norm_2),),
                p + "post_attention_layernorm.weight": (Target(layer.post_norm),),
                p + "post_attention_layernorm_2.weight": (Target(layer.post_norm_2),),
            })
        return targets

    # ---- stage functions ---------------------------------------------------------------------
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [M] int64 -> hidden [M, hidden] (no scaling)."""
        return torch.nn.functional.embedding(tokens, self.embed_tokens)

    def start(self, tokens: torch.Tensor, batch, keys=None) -> tuple[torch.Tensor, None]:
        """(h, e) before loop 0: the embedding [M, hidden], and no loop input (the loops read only h)."""
        return self.embed(tokens), None

    def loop(self, h: torch.Tensor, e: None, batch, t: int) -> torch.Tensor:
        """One full loop at loop index t: all layers, then `model.norm`. h [M, hidden] -> [M, hidden]
        (e: None). Tokens past their depth limit write no K/V; their state is never read."""
        cfg, ops, active = self.config, batch.ops, batch.dense_active
        eps = cfg.rms_norm_eps
        m = h.shape[0]
        hq, hkv, d = self.heads, self.kv_heads, cfg.head_dim
        spec = self.layout.core(t)
        n = ops.rms_norm(h, self.layers[0].input_norm, eps, active_rows=active, out=self._layer_input(h))
        for idx, layer in enumerate(self.layers):
            qkv = ops.linear(n, layer.wqkv, active_rows=active)
            q = qkv[:, : hq * d].view(m, hq, d)
            k = qkv[:, hq * d : (hq + hkv) * d].view(m, hkv, d)
            v = qkv[:, (hq + hkv) * d :].view(m, hkv, d)
            attn = batch.attend(idx, q, k, v, spec)
            # The first update writes a fresh residual so the caller's h is never modified.
            h, n = row_parallel_residual_norm(ops, attn, layer.wo, self.tp, active, h, layer.input_norm_2,
                                              layer.post_norm, eps, "ouro", residual_out=h if idx else None,
                                              normed_out=self._layer_input(h))
            act = ops.linear(n, layer.w_gate_up, activation="swiglu", active_rows=active)
            last = idx + 1 == len(self.layers)
            next_w = self.norm if last else self.layers[idx + 1].input_norm
            h, n = row_parallel_residual_norm(ops, act, layer.w_down, self.tp, active, h, layer.post_norm_2, next_w,
                                              eps, "ouro", residual_out=h, normed_out=None if last else self._layer_input(h))
        return n

    def _layer_input(self, h: torch.Tensor):
        """Where a norm writes the input of a q/k/v or gate/up layer: FP8 rows for W8A8 layers,
        else None (the norm allocates the model dtype's)."""
        if self.quantization != "w8a8_fp8":
            return None
        return Fp8Rows.empty_like(h)

    def head_input(self, h: torch.Tensor, batch) -> torch.Tensor:
        """The LM head reads the last loop's normed state itself."""
        return h

    def new_exit_state(self, mode: str, h0: torch.Tensor) -> ExitState:
        """Survival 1 and nothing pending for each row of h0."""
        return new_exit_state(h0.shape[0], self.device)

    def exit_decision(self, rule: ExitRule, t: int, h: torch.Tensor, batch, rows) -> tuple[torch.Tensor, None]:
        """`ouro_exit` after loop t on the exit gate (gate modes) or the lookahead head's logit."""
        ops, active = batch.ops, batch.active
        gate = self.gate_logits(h, ops, active) if rule.mode in GATE_MODES else None
        look = lookahead_logits(h, rule.lookahead_w, ops, active) if rule.mode == "random_lookahead" else None
        return ouro_exit(rule.mode, t, gate, look, rows.thr, rows.min_l, rows.max_l, rows.trace, rows.ex), None

    def gate_logits(self, h: torch.Tensor, ops, active=None) -> torch.Tensor:
        """Exit-gate logit per row, fp32 [M] (h is the loop's normed state)."""
        out = torch.empty((h.shape[0], 1), dtype=torch.float32, device=h.device)
        ops.linear(h, self.gate_w, out=out, active_rows=active)
        return out[:, 0] + self.gate_b[0]

    def logits(self, h: torch.Tensor, ops, active=None, out=None) -> torch.Tensor:
        """LM head on the normed state: fp32 [M, vocab]."""
        if out is None:
            out = torch.empty((h.shape[0], self.config.vocab_size), dtype=torch.float32, device=h.device)
        return ops.linear(h, self.lm_head, out=out, active_rows=active)
