"""Huginn-0125 as stage functions: prelude, one recurrence of the core, coda.

Math (reference/MODELS.md §2.2): e = prelude(wte(ids) * sqrt(h)); s_0 ~ truncated normal
(counter-based, by position and key: one engine-wide key at prompt positions, so prompt K/V can be
shared, and the request's row key at generated positions); each recurrence s = core(adapter([s, e])); then
x = ln_f(s), coda blocks, ln_f again, tied LM head in fp32. Blocks add the residual first and
normalise the sum: x = n2(x + attn(n1 x)); x = n4(x + mlp(n3 x)). Prelude and coda K/V live in
plane 0 (cache layers 0..P-1 and P..P+C-1); core layer j at recurrence i writes cache layer j
of the recurrence's core plane.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from rlt_kernels.sampling import STREAM_STATE, philox_uniform

from ..cache.layout import KVLayout, PlaneSpec
from .configs import HuginnConfig, check_weight_names, check_weights_complete, hf_weight_shapes
from .exit_rules import LOGIT_CRITERIA, ExitRule, ExitState, huginn_exit, init_huginn_state
from .fp8_weights import linear_weight
from .tensor_parallel import RankSlices, row_parallel_residual_norm, shifted
from .weight_update import Target


@dataclass
class HuginnBlock:
    """Linear weights (wqkv, proj, fc, mlp_proj) are tensors, or `Fp8Weight`s with quantization="fp8"."""

    wqkv: torch.Tensor  # [(H + 2 KVH) * D, hidden]
    q_bias: Optional[torch.Tensor]  # [H, D]
    k_bias: Optional[torch.Tensor]  # [KVH, D]
    proj: torch.Tensor
    fc: torch.Tensor  # [2F, hidden] = [gate half | up half]
    mlp_proj: torch.Tensor
    norm_1: torch.Tensor
    norm_2: torch.Tensor
    norm_3: torch.Tensor
    norm_4: torch.Tensor


_BLOCK_KEYS = ("norm_1.weight", "attn.Wqkv.weight", "attn.proj.weight", "norm_2.weight", "mlp.fc.weight",
               "mlp.proj.weight", "norm_3.weight", "norm_4.weight")


def huginn_initial_state(keys, positions, hidden: int, std: float, device, dtype) -> torch.Tensor:
    """Initial recurrent state s_0 [M, hidden]: truncated normal (±3 std) times sqrt(hidden).

    keys, positions: int64 [M] (tensors or lists). Counter-based: element i of row r is a
    function of (keys[r], positions[r], stream 4, i), so a token's state never depends on its
    batch or on preemption; computed on the device without host synchronisation. std 0 gives zeros.
    """
    keys = torch.as_tensor(keys, dtype=torch.int64, device=device)
    positions = torch.as_tensor(positions, dtype=torch.int64, device=device)
    if std == 0.0 or keys.shape[0] == 0:
        return torch.zeros((keys.shape[0], hidden), dtype=dtype, device=device)
    return _truncated_normal_state(keys, positions, hidden, float(std), dtype)


def request_initial_state(config: HuginnConfig, num_prompt_tokens: int, prompt_key: int, row_key: int,
                          dtype: torch.dtype = torch.float64):
    """s_0 of one request as the engine draws it, by position (the `initial_state` callable of
    `reference_generate`): prompt positions use the engine's prompt key (`stable_hash.prompt_key`),
    generated positions the request's row key. Returns position -> [hidden] on the CPU."""
    std = config.init_std * config.init_scale

    def state(position: int) -> torch.Tensor:
        key = prompt_key if position < num_prompt_tokens else row_key
        return huginn_initial_state([key], [position], config.n_embd, std, "cpu", dtype)[0]

    return state


@torch.library.custom_op("rlt::huginn_initial_state", mutates_args=())
def _truncated_normal_state(keys: torch.Tensor, positions: torch.Tensor, hidden: int, std: float,
                            dtype: torch.dtype) -> torch.Tensor:
    """The noise of `huginn_initial_state` as one opaque op: torch.compile must not re-derive its
    float64 erfinv (a compiled version rounds differently, and every later token would follow)."""
    u = philox_uniform(keys, positions, STREAM_STATE, hidden).double()
    lo, hi = 0.5 * math.erfc(3.0 / math.sqrt(2.0)), 0.5 * math.erfc(-3.0 / math.sqrt(2.0))
    z = math.sqrt(2.0) * torch.erfinv(2.0 * (lo + u * (hi - lo)) - 1.0)
    return (z * std * math.sqrt(hidden)).to(dtype)


@_truncated_normal_state.register_fake
def _(keys, positions, hidden, std, dtype):
    return keys.new_empty((keys.shape[0], hidden), dtype=dtype)


class HuginnModel:
    """Huginn weights on one device plus its stage functions (see module docstring); the runner
    drives it through the `LoopedModel` members (models/looped.py)."""

    rope_style = "gptj"
    random_initial_state = True  # s_0 is noise drawn from the rows' keys
    head_input_attends = True  # the head reads the coda's output

    def __init__(self, config: HuginnConfig, layout: KVLayout, device, dtype, quantization=None):
        self.config, self.layout, self.device, self.dtype = config, layout, torch.device(device), dtype
        self.quantization = quantization  # None or "fp8": how the blocks' and adapter's linear weights are stored
        self.prelude: list[HuginnBlock] = []
        self.core: list[HuginnBlock] = []
        self.coda_blocks: list[HuginnBlock] = []
        self.wte = self.adapter = self.ln_f = None
        # This rank's attention heads and the group summing the partial outputs of the proj and
        # mlp_proj projections (models/tensor_parallel.py); all heads and None without tensor parallelism.
        self.heads, self.kv_heads, self.tp = config.num_heads, config.kv_heads, None

    @property
    def state_std(self) -> float:
        return self.config.init_std * self.config.init_scale

    # ---- loading -----------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        cfg = self.config
        expected = hf_weight_shapes(cfg)
        seen: dict[str, torch.Tensor] = {}
        for name, tensor in weights:
            check_weight_names([name], expected, "Huginn")
            seen[name] = tensor.to(self.device, self.dtype)
        check_weights_complete(seen, expected, "Huginn")
        self.wte = seen["transformer.wte.weight"]
        self.adapter = linear_weight(seen["transformer.adapter.weight"], self.quantization)
        self.ln_f = seen["transformer.ln_f.weight"]
        self.prelude = [self._block(seen, f"transformer.prelude.{i}.") for i in range(cfg.n_layers_in_prelude)]
        self.core = [self._block(seen, f"transformer.core_block.{i}.") for i in range(cfg.n_layers_in_recurrent_block)]
        self.coda_blocks = [self._block(seen, f"transformer.coda.{i}.") for i in range(cfg.n_layers_in_coda)]

    def _block(self, seen, prefix) -> HuginnBlock:
        cfg = self.config
        p = {k: seen.pop(prefix + k) for k in _BLOCK_KEYS}
        q_bias = k_bias = None
        if cfg.qk_bias:
            bias = seen.pop(prefix + "attn.qk_bias")
            q_bias = bias[0, 0].contiguous()
            k_bias = bias[1, 0, : cfg.num_key_value_heads].contiguous()
        q = self.quantization
        return HuginnBlock(
            wqkv=linear_weight(p["attn.Wqkv.weight"], q), q_bias=q_bias, k_bias=k_bias,
            proj=linear_weight(p["attn.proj.weight"], q), fc=linear_weight(p["mlp.fc.weight"], q),
            mlp_proj=linear_weight(p["mlp.proj.weight"], q), norm_1=p["norm_1.weight"],
            norm_2=p["norm_2.weight"], norm_3=p["norm_3.weight"], norm_4=p["norm_4.weight"],
        )

    def weight_targets(self) -> dict[str, tuple[Target, ...]]:
        """Where each checkpoint tensor lives in this loaded model (this rank's shard): its heads' rows
        of Wqkv and of the q/k bias halves, its MLP rows of fc's gate and up halves, its columns of
        proj and mlp.proj (models/weight_update.py)."""
        cfg = self.config
        keep = RankSlices.of(self.tp, cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate_size)
        q, kv, f = (b - a for a, b in (keep.q, keep.kv, keep.mlp))
        k0, v0 = cfg.num_heads * cfg.head_dim, (cfg.num_heads + cfg.kv_heads) * cfg.head_dim
        targets = {"transformer.wte.weight": (Target(self.wte),), "transformer.ln_f.weight": (Target(self.ln_f),),
                   "transformer.adapter.weight": (Target(self.adapter),)}
        groups = (("prelude", self.prelude), ("core_block", self.core), ("coda", self.coda_blocks))
        for group, blocks in groups:
            for i, b in enumerate(blocks):
                p = f"transformer.{group}.{i}."
                targets.update({
                    p + "attn.Wqkv.weight": (Target(b.wqkv, rows=keep.q),
                                             Target(b.wqkv, rows=shifted(keep.kv, k0), at=q),
                                             Target(b.wqkv, rows=shifted(keep.kv, v0), at=q + kv)),
                    p + "attn.proj.weight": (Target(b.proj, cols=keep.q),),
                    p + "mlp.fc.weight": (Target(b.fc, rows=keep.mlp),
                                          Target(b.fc, rows=shifted(keep.mlp, cfg.intermediate_size), at=f)),
                    p + "mlp.proj.weight": (Target(b.mlp_proj, cols=keep.mlp),),
                    **{p + f"norm_{j}.weight": (Target(getattr(b, f"norm_{j}")),) for j in range(1, 5)},
                })
                if cfg.qk_bias:
                    targets[p + "attn.qk_bias"] = (
                        Target(b.q_bias, rows=keep.heads, pick=lambda bias: bias[0, 0]),
                        Target(b.k_bias, rows=keep.kv_heads, pick=lambda bias: bias[1, 0, : cfg.num_key_value_heads]))
        return targets

    # ---- stage functions ---------------------------------------------------------------------
    def _blocks(self, x, blocks, batch, spec: PlaneSpec, first_cache_layer: int, final_norm=None):
        """Run add-then-norm blocks; returns (x, rms(x; final_norm) or None)."""
        cfg, ops, active = self.config, batch.ops, batch.dense_active
        eps = cfg.norm_eps
        m = x.shape[0]
        hq, hkv, d = self.heads, self.kv_heads, cfg.head_dim
        n = ops.rms_norm(x, blocks[0].norm_1, eps, active_rows=active)
        for idx, b in enumerate(blocks):
            qkv = ops.linear(n, b.wqkv, active_rows=active)
            q = qkv[:, : hq * d].view(m, hq, d)
            k = qkv[:, hq * d : (hq + hkv) * d].view(m, hkv, d)
            v = qkv[:, (hq + hkv) * d :].view(m, hkv, d)
            attn = batch.attend(first_cache_layer + idx, q, k, v, spec, q_bias=b.q_bias, k_bias=b.k_bias)
            x, n = row_parallel_residual_norm(ops, attn, b.proj, self.tp, active, x, b.norm_2, b.norm_3, eps, "huginn",
                                              residual_out=x if idx else None)
            act = ops.linear(n, b.fc, activation="swiglu", active_rows=active)
            nxt = blocks[idx + 1].norm_1 if idx + 1 < len(blocks) else final_norm
            x, n = row_parallel_residual_norm(ops, act, b.mlp_proj, self.tp, active, x, b.norm_4, nxt, eps, "huginn",
                                              residual_out=x)
        return x, n

    def embed(self, tokens: torch.Tensor, batch) -> torch.Tensor:
        """Scaled embedding + prelude blocks (plane 0). tokens [M] -> e [M, hidden]."""
        e = torch.nn.functional.embedding(tokens, self.wte) * self.config.embed_scale
        e, _ = self._blocks(e.to(self.dtype), self.prelude, batch, self.layout.boundary(), 0)
        return e

    def initial_state(self, keys, positions) -> torch.Tensor:
        """s_0 for rows with the given row keys and positions (int64 tensors or lists)."""
        return huginn_initial_state(keys, positions, self.config.n_embd, self.state_std, self.device, self.dtype)

    def start(self, tokens: torch.Tensor, batch, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s_0, e) before recurrence 0: the initial state from `keys` [M] at batch.positions, and
        the prelude's output (its K/V written to plane 0)."""
        e = self.embed(tokens, batch)
        return self.initial_state(keys, batch.positions), e

    def loop(self, s: torch.Tensor, e: torch.Tensor, batch, t: int) -> torch.Tensor:
        """One recurrence at index t: s [M, hidden], e [M, hidden] -> new s. Tokens at or past
        their depth limit (batch.depth_limit) keep s: the coda reads their recorded depth's state."""
        ops = batch.ops
        x = ops.linear(torch.cat([s, e], dim=1), self.adapter, active_rows=batch.dense_active)
        s_new, _ = self._blocks(x, self.core, batch, self.layout.core(t), 0)
        if batch.depth_limit is not None:
            s_new = torch.where((batch.depth_limit > t)[:, None], s_new, s)
        return s_new

    def coda(self, s: torch.Tensor, batch) -> torch.Tensor:
        """ln_f -> coda blocks (K/V in plane 0) -> ln_f: the head's input [M, hidden]."""
        cfg = self.config
        x = batch.ops.rms_norm(s, self.ln_f, cfg.norm_eps, active_rows=batch.dense_active)
        _, n = self._blocks(x, self.coda_blocks, batch, self.layout.boundary(), cfg.n_layers_in_prelude, final_norm=self.ln_f)
        return n

    def head_input(self, s: torch.Tensor, batch) -> torch.Tensor:
        """The coda on the final state (its K/V written to plane 0)."""
        return self.coda(s, batch)

    def new_exit_state(self, mode: str, s0: torch.Tensor) -> ExitState:
        """The criteria's starting state (`init_huginn_state`) for rows starting from s0."""
        return init_huginn_state(mode, s0.shape[0], s0, self.config.vocab_size, self.device)

    def exit_decision(self, rule: ExitRule, t: int, s: torch.Tensor, batch, rows
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """`huginn_exit` after recurrence t; the logit criteria run the coda and the head on the
        new state and return those logits (the head's logits of the rows that exit now)."""
        logits = logprobs = None
        if rule.mode in LOGIT_CRITERIA:
            logits = self.logits(self.coda(s, batch), batch.ops, batch.active)
            logprobs = torch.log_softmax(logits, dim=1)
        exit_now = huginn_exit(rule.mode, t, rule.criterion_threshold, rows.min_l, rows.max_l, rows.trace, rows.ex, s,
                               logprobs)
        return exit_now, logits

    def logits(self, n: torch.Tensor, ops, active=None, out=None) -> torch.Tensor:
        """Tied LM head: fp32 [M, vocab]."""
        if out is None:
            out = torch.empty((n.shape[0], self.config.vocab_size), dtype=torch.float32, device=n.device)
        return ops.linear(n, self.wte, out=out, active_rows=active)
