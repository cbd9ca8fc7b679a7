"""Plain-PyTorch Ouro decode step captured whole in one CUDA graph: the baseline to beat.

What a careful PyTorch user would write without custom kernels: unfused q/k/v and gate/up
projections through cuBLAS (F.linear), RMSNorm and RoPE as torch ops, a dense per-(loop, layer)
KV cache of static shape written with index_copy_, SDPA over the whole static context with a
mask, greedy argmax; then the full decode step (all loops and layers) captured in one graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class TorchOuroDecode:
    """Greedy decode of `batch` rows with a static context of `max_ctx` positions."""

    def __init__(self, config, weights: dict, batch: int, max_ctx: int, device="cuda"):
        self.cfg, self.w, self.b, self.ctx = config, weights, batch, max_ctx
        c = config
        slots = c.total_ut_steps * c.num_hidden_layers
        shape = (slots, batch, c.num_key_value_heads, max_ctx, c.head_dim)
        self.k = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self.v = torch.zeros_like(self.k)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=device).float() / c.head_dim))
        ang = torch.outer(torch.arange(max_ctx, device=device).float(), inv)
        self.cos, self.sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=device)
        self.pos = torch.zeros(1, dtype=torch.int64, device=device)
        self.graph = None

    def _step(self):
        c, w = self.cfg, self.w
        eps, b, hq, hkv, d = c.rms_norm_eps, self.b, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        h = F.embedding(self.tokens, w["model.embed_tokens.weight"])
        cos, sin = self.cos[self.pos], self.sin[self.pos]
        mask = (torch.arange(self.ctx, device=h.device) <= self.pos)[None, None, None, :]
        for t in range(c.total_ut_steps):
            for i in range(c.num_hidden_layers):
                p = f"model.layers.{i}."
                x = _rms(h, w[p + "input_layernorm.weight"], eps)
                q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(b, hq, 1, d)
                k = F.linear(x, w[p + "self_attn.k_proj.weight"]).view(b, hkv, 1, d)
                v = F.linear(x, w[p + "self_attn.v_proj.weight"]).view(b, hkv, 1, d)
                q, k = _rope(q, cos, sin), _rope(k, cos, sin)
                slot = t * c.num_hidden_layers + i
                self.k[slot].index_copy_(2, self.pos, k)
                self.v[slot].index_copy_(2, self.pos, v)
                a = F.scaled_dot_product_attention(q, self.k[slot], self.v[slot], attn_mask=mask,
                                                   enable_gqa=hq != hkv)
                h = h + _rms(F.linear(a.reshape(b, hq * d), w[p + "self_attn.o_proj.weight"]), w[p + "input_layernorm_2.weight"], eps)
                x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
                m = F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"])) * F.linear(x, w[p + "mlp.up_proj.weight"])
                h = h + _rms(F.linear(m, w[p + "mlp.down_proj.weight"]), w[p + "post_attention_layernorm_2.weight"], eps)
            h = _rms(h, w["model.norm.weight"], eps)
        logits = F.linear(h, w["lm_head.weight"])
        self.tokens.copy_(logits.argmax(-1))
        self.pos.add_(1)

    def capture(self):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(s)
        self.pos.zero_()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()

    def step_ms(self, iters: int = 20) -> float:
        """Median time of one graph-replayed decode step (positions cycle inside the context)."""
        if self.graph is None:
            self.capture()
        times = []
        for i in range(iters + 3):
            self.pos.fill_(self.ctx // 2 + i % (self.ctx // 4))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.graph.replay()
            end.record()
            end.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end))
        times.sort()
        return times[len(times) // 2]
