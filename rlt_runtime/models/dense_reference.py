"""Dense reference generation: the test oracle for the Ouro and Huginn model paths.

Plain torch in fp64 (or fp32), one request, one token at a time, greedy decoding, written
straight from reference/MODELS.md and the semantics of docs/design.md. It imports nothing from
rlt_kernels or the fast model files, so agreement with them is evidence, not tautology.

KV cache: physical planes per cache layer, `kv[(layer, plane, position)] = (k, v)`. With P
planes a token at loop t (0-based) writes plane `t mod P`, and a query at loop t reads key j
from plane `min(t, last_loop(j)) mod P`, where last_loop(j) is D - 1 while j is being computed
and its exit loop afterwards:

    Ouro   last_exited   P = D        shared       P = 1
    Huginn full          P = D        compress-sN  P = N / (core layers)   (core layers only;
                                                   prelude and coda layers have one plane)

Because tokens run one at a time, a prompt in a shared layout advances position by position
(all loops of one token before the next), exactly as docs/design.md prescribes.

Exit policies (decode tokens only; prompt tokens run the full depth D and the first output
token comes from the prompt's full-depth state, exit depth D) follow docs/design.md §Exit
policies, evaluated in the reference dtype.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from .configs import ModelConfig

OURO_MODES = ("fixed", "ouro", "ouro_delayed", "random_lookahead", "trace")
# Huginn's zero-shot criteria with their default thresholds (MODELS.md §2.5, docs/design.md).
HUGINN_CRITERIA = {"kl": 5e-4, "entropy-diff": 1e-3, "latent-diff": 0.03, "cosine": 1e-3, "argmax-stability": 5}
HUGINN_MODES = ("fixed", "trace", *HUGINN_CRITERIA)


@dataclass
class RefExit:
    """Exit policy for decode tokens.

    mode: "fixed" | Ouro "ouro" | "ouro_delayed" | "random_lookahead" | "trace" |
          Huginn "kl" | "entropy-diff" | "latent-diff" | "cosine" | "argmax-stability" (and "trace").
    threshold: None = the mode's default (1.0 for Ouro gate modes, which means fixed depth;
          MODELS.md §2.5 defaults for Huginn criteria).
    min_loops / max_loops: loops are capped at D_max = min(max_loops or D, D).
    lookahead_weight [hidden] / lookahead_bias [] or [1]: the frozen head of random_lookahead.
    trace: exit depth per output token; entry 0 must be D (the prompt's full depth).

    After loop r a token exits when r == D_max, or (r >= min_loops and):
      ouro: CDF_r >= threshold; ouro_delayed: at r = trigger + 1; random_lookahead: score_{r-1} >=
      threshold (threshold >= 1 disables all three); trace: r == trace[i];
      kl: KL(p_{r-1} || p_r) < threshold (p_0 uniform); entropy-diff: |H_r - H_{r-1}| < threshold
      (H_0 = log V); latent-diff: |s_r - s_{r-1}| / |s_r| < threshold; cosine: 1 - cos(s_r, s_{r-1})
      < threshold (cos = 0 against a zero state); argmax-stability: run of equal argmaxes >= threshold.
    Huginn criteria that need p_r run the coda and head after every loop; the token's coda K/V
    ends up as its exit state's.
    """

    mode: str = "fixed"
    threshold: Optional[float] = None
    min_loops: int = 1
    max_loops: Optional[int] = None
    lookahead_weight: Optional[torch.Tensor] = None
    lookahead_bias: Optional[torch.Tensor] = None
    trace: Optional[Sequence[int]] = None


@dataclass
class RefResult:
    tokens: list[int] = field(default_factory=list)  # generated ids, a final stop id included
    exit_depths: list[int] = field(default_factory=list)  # loops run for each generated token
    logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] each, the distribution it came from
    prompt_logits: list[torch.Tensor] = field(default_factory=list)  # [vocab] at each prompt position (predicts the next token)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _inv_freq(head_dim: int, theta: float, dtype) -> torch.Tensor:
    return theta ** (-torch.arange(0, head_dim, 2, dtype=dtype) / head_dim)


def _rope_rotate_half(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """x [heads, head_dim]; dim i pairs with i + head_dim/2 (Ouro, HF convention)."""
    angle = pos * _inv_freq(x.shape[-1], theta, x.dtype)
    cos, sin = torch.cat([angle.cos(), angle.cos()]), torch.cat([angle.sin(), angle.sin()])
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _rope_interleaved(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """x [heads, head_dim]; dims (2i, 2i+1) form a complex pair (Huginn)."""
    angle = pos * _inv_freq(x.shape[-1], theta, x.dtype)
    re, im = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = re * angle.cos() - im * angle.sin()
    out[..., 1::2] = re * angle.sin() + im * angle.cos()
    return out


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q [H, hd]; keys/values [n, KVH, hd]; query head h reads kv head h // (H / KVH). -> [H * hd]."""
    rep = q.shape[0] // keys.shape[1]
    k, v = keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1)
    scores = torch.einsum("hd,nhd->hn", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hn,nhd->hd", scores.softmax(-1), v).reshape(-1)


class _Cache:
    """Physical KV planes of one request plus each token's last loop (see module docstring)."""

    def __init__(self):
        self.kv: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.last_loop: list[int] = []

    def attend(self, layer, q, k, v, pos: int, loop: int, planes: int) -> torch.Tensor:
        """Write the token's (k, v) at plane loop mod planes, then attend over positions 0..pos."""
        self.kv[(layer, loop % planes, pos)] = (k, v)
        entries = [self.kv[(layer, min(loop, self.last_loop[j]) % planes, j)] for j in range(pos + 1)]
        return _attend(q, torch.stack([e[0] for e in entries]), torch.stack([e[1] for e in entries]))


class _ExitRule:
    """Decides, after each loop r (1-based) of one decode token, whether the token exits."""

    def __init__(self, spec: RefExit, depth: int, output_index: int):
        self.spec, self.d_max = spec, min(spec.max_loops or depth, depth)
        default = HUGINN_CRITERIA.get(spec.mode, 1.0)
        self.threshold = default if spec.threshold is None else spec.threshold
        self.survival, self.trigger = 1.0, None  # ouro / ouro_delayed
        self.prev_score = None  # random_lookahead
        self.prev_logp = self.prev_entropy = self.prev_argmax = None  # Huginn criteria
        self.same_argmax = 0
        self.trace_depth = None
        if spec.mode == "trace":
            if spec.trace is None or output_index >= len(spec.trace):
                raise ValueError(f"trace has no exit depth for output token {output_index}")
            self.trace_depth = int(spec.trace[output_index])
            if not 1 <= self.trace_depth <= depth:
                raise ValueError(f"trace depth {self.trace_depth} for output token {output_index} is not in 1..{depth}")

    def ouro(self, r: int, h: torch.Tensor, gate_w: torch.Tensor, gate_b: torch.Tensor) -> bool:
        """Ouro modes; h is the normed state after loop r."""
        spec, mode = self.spec, self.spec.mode
        if r == self.d_max:
            return True
        if mode == "trace":
            return r == self.trace_depth
        if mode == "fixed" or self.threshold >= 1.0:
            return False
        if mode == "random_lookahead":
            score = torch.sigmoid(h @ spec.lookahead_weight.reshape(-1).to(h) + spec.lookahead_bias.reshape(()).to(h))
            exits = self.prev_score is not None and self.prev_score >= self.threshold and r >= spec.min_loops
            self.prev_score = float(score)
            return exits
        lam = torch.sigmoid(h @ gate_w.reshape(-1) + gate_b.reshape(()))
        self.survival = self.survival * (1.0 - lam)
        cdf = float(1.0 - self.survival)
        if mode == "ouro":
            return r >= spec.min_loops and cdf >= self.threshold
        if self.trigger is not None:  # ouro_delayed: exit one loop after the trigger
            return r == self.trigger + 1
        if r >= spec.min_loops and cdf >= self.threshold:
            self.trigger = r
        return False

    def huginn(self, r: int, state: torch.Tensor, prev_state: torch.Tensor,
               logits: Callable[[], torch.Tensor]) -> bool:
        """Huginn modes; state s_r, prev_state s_{r-1}, logits() = coda + head of s_r."""
        mode = self.spec.mode
        if mode in ("fixed", "trace"):
            return r == self.d_max or r == self.trace_depth
        met = False
        if mode == "latent-diff":
            met = float((state - prev_state).norm() / state.norm()) < self.threshold
        elif mode == "cosine":
            denom = state.norm() * prev_state.norm()
            cos = float(state @ prev_state / denom) if denom > 0 else 0.0
            met = 1.0 - cos < self.threshold
        else:
            logp = torch.log_softmax(logits(), dim=-1)
            if mode == "kl":
                prev = self.prev_logp if self.prev_logp is not None else torch.full_like(logp, -math.log(logp.numel()))
                met = float((prev.exp() * (prev - logp)).sum()) < self.threshold
                self.prev_logp = logp
            elif mode == "entropy-diff":
                entropy = float(-(logp.exp() * logp).sum())
                prev = self.prev_entropy if self.prev_entropy is not None else math.log(logp.numel())
                met = abs(entropy - prev) < self.threshold
                self.prev_entropy = entropy
            else:  # argmax-stability
                top = int(logp.argmax())
                self.same_argmax = self.same_argmax + 1 if top == self.prev_argmax else 1
                self.prev_argmax = top
                met = self.same_argmax >= self.threshold
        return r == self.d_max or (r >= self.spec.min_loops and met)


class _Ouro:
    def __init__(self, cfg, w, planes):
        self.cfg, self.w, self.planes = cfg, w, planes

    def embed(self, token: int) -> torch.Tensor:
        return self.w["model.embed_tokens.weight"][token]

    def loop(self, h: torch.Tensor, pos: int, t: int, cache: _Cache) -> torch.Tensor:
        """All layers once, then model.norm; returns the normed state (next loop's input)."""
        cfg, w, eps = self.cfg, self.w, self.cfg.rms_norm_eps
        hd = cfg.head_dim
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}."
            x = _rms(h, w[p + "input_layernorm.weight"], eps)
            q = _rope_rotate_half((w[p + "self_attn.q_proj.weight"] @ x).view(-1, hd), pos, cfg.rope_theta)
            k = _rope_rotate_half((w[p + "self_attn.k_proj.weight"] @ x).view(-1, hd), pos, cfg.rope_theta)
            v = (w[p + "self_attn.v_proj.weight"] @ x).view(-1, hd)
            a = w[p + "self_attn.o_proj.weight"] @ cache.attend(layer, q, k, v, pos, t, self.planes)
            h = h + _rms(a, w[p + "input_layernorm_2.weight"], eps)
            x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
            gate, up = w[p + "mlp.gate_proj.weight"] @ x, w[p + "mlp.up_proj.weight"] @ x
            m = w[p + "mlp.down_proj.weight"] @ (F.silu(gate) * up)
            h = h + _rms(m, w[p + "post_attention_layernorm_2.weight"], eps)
        return _rms(h, w["model.norm.weight"], eps)

    def token(self, token: int, pos: int, cache: _Cache, depth: int, rule: Optional[_ExitRule]):
        """Run one token; returns (logits, loops run). rule None = full depth."""
        h = self.embed(token)
        for t in range(depth):
            h = self.loop(h, pos, t, cache)
            if rule is not None and rule.ouro(t + 1, h, self.w["model.early_exit_gate.weight"],
                                              self.w["model.early_exit_gate.bias"]):
                break
        return self.w["lm_head.weight"] @ h, t + 1


class _Huginn:
    def __init__(self, cfg, w, planes):
        self.cfg, self.w, self.planes = cfg, w, planes

    def block(self, prefix: str, x: torch.Tensor, pos: int, cache: _Cache, layer, loop: int, planes: int):
        """x = n2(x + attn(n1 x)); x = n4(x + mlp(n3 x)) — residual first, then the norm."""
        cfg, w, eps = self.cfg, self.w, self.cfg.norm_eps
        hd, n_q, n_kv = cfg.head_dim, cfg.n_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        qkv = w[prefix + "attn.Wqkv.weight"] @ _rms(x, w[prefix + "norm_1.weight"], eps)
        q, k, v = qkv[:n_q].view(-1, hd), qkv[n_q:n_q + n_kv].view(-1, hd), qkv[n_q + n_kv:].view(-1, hd)
        if cfg.qk_bias:  # [2, 1, n_heads, hd]; the k bias uses heads [0, kv_heads)
            bias = w[prefix + "attn.qk_bias"]
            q, k = q + bias[0, 0], k + bias[1, 0, : cfg.num_key_value_heads]
        q, k = _rope_interleaved(q, pos, cfg.rope_base), _rope_interleaved(k, pos, cfg.rope_base)
        a = w[prefix + "attn.proj.weight"] @ cache.attend(layer, q, k, v, pos, loop, planes)
        x = _rms(x + a, w[prefix + "norm_2.weight"], eps)
        gate, up = (w[prefix + "mlp.fc.weight"] @ _rms(x, w[prefix + "norm_3.weight"], eps)).chunk(2)
        return _rms(x + w[prefix + "mlp.proj.weight"] @ (F.silu(gate) * up), w[prefix + "norm_4.weight"], eps)

    def coda_logits(self, s: torch.Tensor, pos: int, cache: _Cache) -> torch.Tensor:
        """ln_f, coda blocks, ln_f again, tied head. Rewrites the token's coda K/V."""
        w, eps = self.w, self.cfg.norm_eps
        x = _rms(s, w["transformer.ln_f.weight"], eps)
        for i in range(self.cfg.n_layers_in_coda):
            x = self.block(f"transformer.coda.{i}.", x, pos, cache, ("coda", i), 0, 1)
        return w["transformer.wte.weight"] @ _rms(x, w["transformer.ln_f.weight"], eps)

    def token(self, token: int, pos: int, cache: _Cache, depth: int, rule: Optional[_ExitRule], s0: torch.Tensor):
        cfg, w = self.cfg, self.w
        e = w["transformer.wte.weight"][token] * math.sqrt(cfg.n_embd)
        for i in range(cfg.n_layers_in_prelude):
            e = self.block(f"transformer.prelude.{i}.", e, pos, cache, ("prelude", i), 0, 1)
        s = s0
        for r in range(1, depth + 1):
            prev, x = s, w["transformer.adapter.weight"] @ torch.cat([s, e])
            for j in range(cfg.n_layers_in_recurrent_block):
                x = self.block(f"transformer.core_block.{j}.", x, pos, cache, ("core", j), r - 1, self.planes)
            s = x
            if rule is not None and rule.huginn(r, s, prev, lambda: self.coda_logits(s, pos, cache)):
                break
        return self.coda_logits(s, pos, cache), r


@contextlib.contextmanager
def _one_thread():
    """The reference's ops are tiny; intra-op threads only add hand-off cost (large under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _planes(config: ModelConfig, kv_layout: Optional[str], depth: int) -> int:
    if config.family == "ouro":
        layout = kv_layout or "last_exited"
        if layout in ("last_exited", "shared"):
            return depth if layout == "last_exited" else 1
        raise ValueError(f"kv_layout {layout!r} is not an Ouro layout; use 'last_exited' or 'shared'")
    layout = kv_layout or "full"
    if layout in ("full", "last_exited"):  # one plane per recurrence, read LAST_EXITED style
        return depth
    core = config.n_layers_in_recurrent_block
    if layout.startswith("compress-s") and layout[len("compress-s"):].isdigit():
        n = int(layout[len("compress-s"):])
        if n >= core and n % core == 0:
            return n // core
    raise ValueError(f"kv_layout {layout!r} is not a Huginn layout; use 'full' ('last_exited') or 'compress-sN' "
                     f"with N a positive multiple of the {core} core layers")


def reference_logit_processing(logits: torch.Tensor, prompt: Sequence[int], output: Sequence[int], params,
                               min_token_stops: Sequence[int] = (),
                               bad_words: Sequence[Sequence[int]] = ()) -> torch.Tensor:
    """vLLM's logit processing of one [vocab] row, token by token: logit_bias added; while fewer
    than params.min_tokens outputs exist the min_token_stops banned; a bad word's last token banned
    when the output ends with its other tokens; repetition_penalty over prompt and output tokens
    (positive logits divided, negative multiplied); frequency_penalty * count + presence_penalty
    subtracted over output tokens; tokens outside params.allowed_token_ids (when given) set to -inf.
    `params` carries SamplingParams' field names."""
    x = logits.clone()
    allowed = getattr(params, "allowed_token_ids", None)
    if allowed is not None:
        outside = torch.ones_like(x, dtype=torch.bool)
        outside[list(allowed)] = False
        x[outside] = -math.inf
    for t, b in (params.logit_bias or {}).items():
        x[t] += b
    if len(output) < params.min_tokens:
        for t in min_token_stops:
            x[t] = -math.inf
    for word in bad_words:
        prefix = list(word[:-1])
        if not prefix or (len(output) >= len(prefix) and list(output[len(output) - len(prefix):]) == prefix):
            x[word[-1]] = -math.inf
    for t in set(prompt) | set(output):
        x[t] = x[t] / params.repetition_penalty if x[t] > 0 else x[t] * params.repetition_penalty
    for t, c in Counter(output).items():
        x[t] -= params.frequency_penalty * c + params.presence_penalty
    return x


def reference_generate(config: ModelConfig, weights: dict[str, torch.Tensor], prompt_ids: list[int],
                       max_new_tokens: int, *, exit: Optional[RefExit] = None, kv_layout: Optional[str] = None,
                       depth: Optional[int] = None, stop_token_ids: Sequence[int] = (),
                       initial_state: Optional[Callable[[int], torch.Tensor]] = None,
                       process_logits: Optional[Callable[[torch.Tensor, list[int]], torch.Tensor]] = None,
                       dtype: torch.dtype = torch.float64) -> RefResult:
    """Greedy generation (argmax, lowest id on ties) for one request.

    weights: every tensor of hf_weight_shapes(config), in HF names (Huginn's head is wte).
    kv_layout: Ouro "last_exited" (default) | "shared"; Huginn "full" (default, alias
    "last_exited") | "compress-sN" (N a multiple of the core layer count).
    depth: D, default config.num_loops. stop_token_ids end generation (the stop id is kept).
    initial_state(position) -> [hidden]: Huginn's s0 as it enters the first adapter (already
    scaled by sqrt(hidden)); None = zeros (init_scale 0).
    process_logits(logits [vocab], tokens generated so far) -> the [vocab] row the argmax picks
    from (e.g. `reference_logit_processing`); RefResult.logits keeps the raw rows.
    """
    depth = depth or config.num_loops
    exit = exit or RefExit()
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    modes = OURO_MODES if config.family == "ouro" else HUGINN_MODES
    if exit.mode not in modes:
        raise ValueError(f"exit mode {exit.mode!r} is not available for {config.family}; use one of {modes}")
    if exit.mode == "random_lookahead" and (exit.lookahead_weight is None or exit.lookahead_bias is None):
        raise ValueError("random_lookahead needs lookahead_weight and lookahead_bias")
    if exit.mode == "trace" and (not exit.trace or exit.trace[0] != depth):
        raise ValueError(f"trace must start with the prompt's full depth {depth}")
    if exit.min_loops < 1 or (exit.max_loops is not None and exit.max_loops < 1):
        raise ValueError("min_loops and max_loops must be >= 1")
    w = {name: t.to(dtype) for name, t in weights.items()}
    planes = _planes(config, kv_layout, depth)
    model = _Ouro(config, w, planes) if config.family == "ouro" else _Huginn(config, w, planes)
    hidden = config.hidden_size

    def run(token: int, pos: int, rule: Optional[_ExitRule]):
        cache.last_loop.append(depth - 1)
        if config.family == "ouro":
            logits, loops = model.token(token, pos, cache, depth, rule)
        else:
            s0 = initial_state(pos).to(dtype).reshape(hidden) if initial_state else torch.zeros(hidden, dtype=dtype)
            logits, loops = model.token(token, pos, cache, depth, rule, s0)
        cache.last_loop[pos] = loops - 1
        return logits, loops

    cache, result = _Cache(), RefResult()
    with _one_thread():
        for pos, token in enumerate(prompt_ids if max_new_tokens > 0 else ()):
            logits, loops = run(int(token), pos, None)
            result.prompt_logits.append(logits)
        while len(result.tokens) < max_new_tokens:
            token = int((process_logits(logits, list(result.tokens)) if process_logits else logits).argmax())
            result.tokens.append(token)
            result.exit_depths.append(loops)
            result.logits.append(logits)
            if token in stop_token_ids or len(result.tokens) == max_new_tokens:
                break
            # Output token i is fed back at position len(prompt) + i.
            logits, loops = run(token, len(prompt_ids) + len(result.tokens) - 1,
                                _ExitRule(exit, depth, len(result.tokens)))
    return result
