"""Sanity of the dense reference (the oracle other model tests trust).

The main check is against a second, differently organised implementation written here: a
no-cache recompute of the whole sequence (all positions at once, causal SDPA, complex-number
RoPE for Huginn) with per-token exit depths applied LAST_EXITED style. The exit policies are
checked on worked examples with gate weights that force known hazards.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from rlt_runtime.models.configs import OuroConfig
from rlt_runtime.models.dense_reference import RefExit, reference_generate
from rlt_runtime.models.presets import preset_config, preset_weights

F64 = torch.float64
PROMPT = [11, 200, 37, 5, 260, 99]


def _weights(cfg, seed=0):
    """Preset weights with norm weights and q/k biases randomised (their init, 1 and 0, hides bugs)."""
    gen = torch.Generator().manual_seed(seed + 1000)
    weights = {}
    for name, t in preset_weights(cfg, seed=seed, dtype=F64):
        if name.endswith("norm.weight") or "norm_" in name or "layernorm" in name or name.endswith("ln_f.weight"):
            t = t + 0.3 * torch.randn(t.shape, generator=gen, dtype=F64)
        elif name.endswith("qk_bias"):
            t = 0.5 * torch.randn(t.shape, generator=gen, dtype=F64)
        weights[name] = t
    return weights


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _sdpa(q, k, v):
    """q [n, H, hd], k/v [n, KVH, hd] -> [n, H * hd], causal, grouped-query."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True, enable_gqa=True)
    return out.transpose(0, 1).reshape(q.shape[0], -1)


def _pick(planes, t, last):
    """K or V a query at loop t sees: position j from plane min(t, last[j])."""
    idx = torch.minimum(torch.full_like(last, t), last)
    return torch.stack([planes[int(p)][j] for j, p in enumerate(idx)])


def ouro_recompute(cfg, w, ids, last, depth):
    """Logits [n, vocab] of every position; token j runs loops 0..last[j] (0-based)."""
    n, hd, eps = len(ids), cfg.head_dim, cfg.rms_norm_eps
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=F64) / hd)
    freqs = torch.outer(torch.arange(n, dtype=F64), inv)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]

    def rope(x):
        return x * cos + torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1) * sin

    h = w["model.embed_tokens.weight"][ids]
    planes = {}
    for t in range(depth):
        x = h
        for layer in range(cfg.num_hidden_layers):
            p = f"model.layers.{layer}."
            a_in = _rms(x, w[p + "input_layernorm.weight"], eps)
            q = rope((a_in @ w[p + "self_attn.q_proj.weight"].T).view(n, -1, hd))
            k = rope((a_in @ w[p + "self_attn.k_proj.weight"].T).view(n, -1, hd))
            v = (a_in @ w[p + "self_attn.v_proj.weight"].T).view(n, -1, hd)
            planes.setdefault(layer, {})[t] = (k, v)
            ks = _pick({s: kv[0] for s, kv in planes[layer].items()}, t, last)
            vs = _pick({s: kv[1] for s, kv in planes[layer].items()}, t, last)
            x = x + _rms(_sdpa(q, ks, vs) @ w[p + "self_attn.o_proj.weight"].T, w[p + "input_layernorm_2.weight"], eps)
            m_in = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
            m = (F.silu(m_in @ w[p + "mlp.gate_proj.weight"].T) * (m_in @ w[p + "mlp.up_proj.weight"].T))
            x = x + _rms(m @ w[p + "mlp.down_proj.weight"].T, w[p + "post_attention_layernorm_2.weight"], eps)
        x = _rms(x, w["model.norm.weight"], eps)
        h = torch.where((last >= t)[:, None], x, h)  # exited tokens keep their exit state
    return h @ w["lm_head.weight"].T, h


def huginn_recompute(cfg, w, ids, last, depth, s0):
    n, hd, eps = len(ids), cfg.head_dim, cfg.norm_eps
    inv = 1.0 / cfg.rope_base ** (torch.arange(0, hd, 2, dtype=F64) / hd)
    rot = torch.polar(torch.ones(n, hd // 2, dtype=F64), torch.outer(torch.arange(n, dtype=F64), inv))[:, None]

    def rope(x):  # adjacent pairs as complex numbers
        return torch.view_as_real(torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2)) * rot).flatten(-2)

    def block(p, x, core_t=None):
        qkv = _rms(x, w[p + "norm_1.weight"], eps) @ w[p + "attn.Wqkv.weight"].T
        nq, nkv = cfg.n_heads * hd, cfg.num_key_value_heads * hd
        q, k, v = qkv[:, :nq].view(n, -1, hd), qkv[:, nq:nq + nkv].view(n, -1, hd), qkv[:, nq + nkv:].view(n, -1, hd)
        bias = w[p + "attn.qk_bias"]
        q, k = rope(q + bias[0]), rope(k + bias[1, :, : cfg.num_key_value_heads])
        if core_t is not None:
            core_planes.setdefault(p, {})[core_t] = (k, v)
            k = _pick({s: kv[0] for s, kv in core_planes[p].items()}, core_t, last)
            v = _pick({s: kv[1] for s, kv in core_planes[p].items()}, core_t, last)
        x = _rms(x + _sdpa(q, k, v) @ w[p + "attn.proj.weight"].T, w[p + "norm_2.weight"], eps)
        gate, up = (_rms(x, w[p + "norm_3.weight"], eps) @ w[p + "mlp.fc.weight"].T).chunk(2, dim=-1)
        return _rms(x + (F.silu(gate) * up) @ w[p + "mlp.proj.weight"].T, w[p + "norm_4.weight"], eps)

    core_planes = {}
    e = w["transformer.wte.weight"][ids] * math.sqrt(cfg.n_embd)
    for i in range(cfg.n_layers_in_prelude):
        e = block(f"transformer.prelude.{i}.", e)
    s = s0
    for t in range(depth):
        x = torch.cat([s, e], -1) @ w["transformer.adapter.weight"].T
        for j in range(cfg.n_layers_in_recurrent_block):
            x = block(f"transformer.core_block.{j}.", x, core_t=t)
        s = torch.where((last >= t)[:, None], x, s)
    x = _rms(s, w["transformer.ln_f.weight"], eps)
    for i in range(cfg.n_layers_in_coda):
        x = block(f"transformer.coda.{i}.", x)
    return _rms(x, w["transformer.ln_f.weight"], eps) @ w["transformer.wte.weight"].T, s


def _recompute(cfg, w, ids, last, depth, s0_fn=None):
    """(logits [n, vocab], final states [n, hidden]) of the no-cache implementations."""
    if cfg.family == "ouro":
        return ouro_recompute(cfg, w, ids, last, depth)
    s0 = torch.stack([s0_fn(p) for p in range(len(ids))]) if s0_fn else torch.zeros(len(ids), cfg.n_embd, dtype=F64)
    return huginn_recompute(cfg, w, ids, last, depth, s0)


def _check_against_recompute(cfg, w, prompt, trace, depth, s0_fn=None):
    result = reference_generate(cfg, w, prompt, len(trace), exit=RefExit("trace", trace=trace), depth=depth,
                                initial_state=s0_fn)
    assert result.exit_depths == list(trace)
    ids = torch.tensor(prompt + result.tokens[:-1])
    last = torch.tensor([depth] * len(prompt) + list(trace[1:])) - 1
    logits, _ = _recompute(cfg, w, ids, last, depth, s0_fn)
    expected = logits[len(prompt) - 1:]
    assert len(result.logits) == len(expected)
    for got, want in zip(result.logits, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert result.tokens == [int(x.argmax()) for x in expected]


MHA_OURO = OuroConfig(vocab_size=320, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                      num_attention_heads=3, num_key_value_heads=3, head_dim=16, rope_theta=10000.0, total_ut_steps=3)


@pytest.mark.parametrize("cfg, depth", [(preset_config("ouro-tiny"), 4), (preset_config("ouro-tiny"), 1),
                                        (MHA_OURO, 3), (MHA_OURO, 2)], ids=["gqa-D4", "gqa-D1", "mha-D3", "mha-D2"])
def test_ouro_full_depth_equals_no_cache_recompute(cfg, depth):
    _check_against_recompute(cfg, _weights(cfg), PROMPT, [depth] * 6, depth)


def test_ouro_last_exited_equals_recompute_with_frozen_exits():
    cfg = preset_config("ouro-tiny")
    _check_against_recompute(cfg, _weights(cfg), PROMPT, [4, 1, 3, 2, 4, 1, 2], 4)


@pytest.mark.parametrize("depth", [1, 3])
def test_huginn_full_depth_equals_no_cache_recompute(depth):
    cfg = preset_config("huginn-tiny")
    _check_against_recompute(cfg, _weights(cfg), PROMPT, [depth] * 5, depth)


def test_huginn_exits_and_random_initial_state_equal_recompute():
    cfg = preset_config("huginn-tiny")
    states = torch.randn(20, cfg.n_embd, dtype=F64, generator=torch.Generator().manual_seed(1)) * 0.6
    _check_against_recompute(cfg, _weights(cfg), PROMPT, [4, 2, 1, 4, 3], 4, s0_fn=lambda p: states[p])


def test_fp32_reference_is_close_to_fp64():
    cfg = preset_config("huginn-tiny")
    w = _weights(cfg)
    a = reference_generate(cfg, w, PROMPT, 3)
    b = reference_generate(cfg, w, PROMPT, 3, dtype=torch.float32)
    assert b.logits[0].dtype == torch.float32
    torch.testing.assert_close(b.logits[0].double(), a.logits[0], rtol=1e-4, atol=1e-4)


# ---- Ouro layouts and exit policies -----------------------------------------------------------

def _gate(w, hazard):
    """Force λ = hazard at every loop: zero gate weight, bias logit(hazard)."""
    w = dict(w)
    w["model.early_exit_gate.weight"] = torch.zeros_like(w["model.early_exit_gate.weight"])
    w["model.early_exit_gate.bias"] = torch.full_like(w["model.early_exit_gate.bias"], math.log(hazard / (1 - hazard)))
    return w


OURO_CFG = preset_config("ouro-tiny")
OURO_W = _weights(OURO_CFG)


def test_shared_layout():
    one = reference_generate(OURO_CFG, OURO_W, [7], 5, kv_layout="shared")
    ref = reference_generate(OURO_CFG, OURO_W, [7], 5, kv_layout="last_exited")
    torch.testing.assert_close(one.logits[0], ref.logits[0], rtol=0, atol=0)  # nothing earlier to read
    assert any(not torch.allclose(a, b) for a, b in zip(one.logits[1:], ref.logits[1:]))  # decode reads final K/V
    longer = reference_generate(OURO_CFG, OURO_W, PROMPT, 2, kv_layout="shared")
    assert not torch.allclose(longer.logits[0], reference_generate(OURO_CFG, OURO_W, PROMPT, 1).logits[0])
    # With one loop there is one plane either way.
    a = reference_generate(OURO_CFG, OURO_W, PROMPT, 4, kv_layout="shared", depth=1)
    b = reference_generate(OURO_CFG, OURO_W, PROMPT, 4, depth=1)
    assert a.tokens == b.tokens and all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))


@pytest.mark.parametrize("mode, threshold, min_loops, max_loops, depth", [
    ("ouro", 0.5, 1, None, 2),  # CDF 0.3, 0.51: the worked example
    ("ouro", 0.6, 1, None, 3),  # CDF 0.657 at 3
    ("ouro", 0.5, 3, None, 3),  # min_loops delays the exit
    ("ouro", 0.5, 1, 1, 1),  # max_loops caps
    ("ouro", 1.0, 1, None, 4),  # threshold 1 = fixed depth
    ("ouro", 1.0, 1, 3, 3),
    ("ouro_delayed", 0.5, 1, None, 3),  # trigger at 2, exit after 3
    ("ouro_delayed", 0.5, 3, None, 4),
    ("ouro_delayed", 0.2, 1, None, 2),
    ("ouro_delayed", 0.6, 1, 3, 3),  # trigger at 3, capped at D_max 3
    ("fixed", 0.0, 1, 2, 2),
])
def test_hazard_exit_policies(mode, threshold, min_loops, max_loops, depth):
    w = _gate(OURO_W, 0.3)
    spec = RefExit(mode, threshold=threshold, min_loops=min_loops, max_loops=max_loops)
    result = reference_generate(OURO_CFG, w, PROMPT, 4, exit=spec)
    assert result.exit_depths == [4, depth, depth, depth]
    # The exit decision only selects depths: the same depths replayed as a trace give the same run.
    replay = reference_generate(OURO_CFG, w, PROMPT, 4, exit=RefExit("trace", trace=result.exit_depths))
    assert replay.tokens == result.tokens and all(torch.equal(a, b) for a, b in zip(replay.logits, result.logits))


@pytest.mark.parametrize("bias, threshold, min_loops, depth", [
    (2.0, 0.5, 1, 2),  # score 0.88 at loop 1 -> exit after loop 2
    (2.0, 0.5, 3, 3),
    (-2.0, 0.5, 1, 4),  # score 0.12 never triggers
    (2.0, 1.0, 1, 4),  # threshold 1 disables adaptive exit
])
def test_random_lookahead(bias, threshold, min_loops, depth):
    spec = RefExit("random_lookahead", threshold=threshold, min_loops=min_loops,
                   lookahead_weight=torch.zeros(OURO_CFG.hidden_size), lookahead_bias=torch.tensor([bias]))
    assert reference_generate(OURO_CFG, OURO_W, PROMPT, 3, exit=spec).exit_depths == [4, depth, depth]


def test_trace_depths_and_stop_tokens():
    trace = [4, 3, 1, 2, 4, 1]
    result = reference_generate(OURO_CFG, OURO_W, PROMPT, 6, exit=RefExit("trace", trace=trace))
    assert result.exit_depths == trace
    stop = result.tokens[2]
    stopped = reference_generate(OURO_CFG, OURO_W, PROMPT, 6, exit=RefExit("trace", trace=trace),
                                 stop_token_ids=(stop,))
    first = result.tokens.index(stop)
    assert stopped.tokens == result.tokens[:first + 1] and stopped.exit_depths == trace[:first + 1]
    with pytest.raises(ValueError, match="trace must start with the prompt's full depth 4"):
        reference_generate(OURO_CFG, OURO_W, PROMPT, 2, exit=RefExit("trace", trace=[2, 2]))
    with pytest.raises(ValueError, match="no exit depth for output token 2"):
        reference_generate(OURO_CFG, OURO_W, PROMPT, 3, exit=RefExit("trace", trace=[4, 2]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="exit mode 'kl' is not available for ouro"):
        reference_generate(OURO_CFG, OURO_W, PROMPT, 2, exit=RefExit("kl"))
    with pytest.raises(ValueError, match="kv_layout 'full' is not an Ouro layout"):
        reference_generate(OURO_CFG, OURO_W, PROMPT, 2, kv_layout="full")
    huginn = preset_config("huginn-tiny")
    with pytest.raises(ValueError, match="compress-sN"):
        reference_generate(huginn, _weights(huginn), PROMPT, 2, kv_layout="compress-s3")


# ---- Huginn -------------------------------------------------------------------------------------

HUGINN_CFG = preset_config("huginn-tiny")
HUGINN_W = _weights(HUGINN_CFG)


def test_huginn_zero_state_is_deterministic_and_depth_matters():
    a = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 4)
    b = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 4)
    assert a.tokens == b.tokens and all(torch.equal(x, y) for x, y in zip(a.logits, b.logits))
    assert a.exit_depths == [4] * 4
    for depth in (1, 2, 8):
        other = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 1, depth=depth)
        assert not torch.allclose(other.logits[0], a.logits[0]) and other.exit_depths == [depth]
    noisy = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 1, initial_state=lambda p: torch.ones(64) * 0.5)
    assert not torch.allclose(noisy.logits[0], a.logits[0])


def test_huginn_compress_layouts():
    full = reference_generate(HUGINN_CFG, HUGINN_W, [7], 5)
    s4 = reference_generate(HUGINN_CFG, HUGINN_W, [7], 5, kv_layout="compress-s4")  # 2 core layers: 2 planes
    torch.testing.assert_close(s4.logits[0], full.logits[0], rtol=0, atol=0)
    assert any(not torch.allclose(a, b) for a, b in zip(s4.logits[1:], full.logits[1:]))
    # Position-by-position prefill: later prompt tokens already read earlier tokens' overwritten planes.
    assert not torch.allclose(reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 1, kv_layout="compress-s4").logits[0],
                              reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 1).logits[0])
    # One plane per recurrence (8 = 2 core layers x 4 recurrences) is the full layout.
    s8 = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 4, kv_layout="compress-s8")
    ref = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 4)
    assert s8.tokens == ref.tokens and all(torch.equal(a, b) for a, b in zip(s8.logits, ref.logits))


def _decode_signals(cfg, w, depth, s0_fn=None):
    """[(logits, state)] of the first decode token after each loop r = 1..depth (from traces + recompute)."""
    out = []
    for r in range(1, depth + 1):
        res = reference_generate(cfg, w, PROMPT, 2, exit=RefExit("trace", trace=[depth, r]), initial_state=s0_fn)
        ids = torch.tensor(PROMPT + res.tokens[:1])
        logits, states = _recompute(cfg, w, ids, torch.tensor([depth - 1] * len(PROMPT) + [r - 1]), depth, s0_fn)
        torch.testing.assert_close(res.logits[1], logits[-1], rtol=1e-9, atol=1e-9)
        out.append((res.logits[1], states[-1]))
    return out


def _first(values, met, depth, start=1):
    return next((r for r, v in enumerate(values, start) if met(v)), depth)


S0 = 0.6 * torch.randn(16, 64, dtype=F64, generator=torch.Generator().manual_seed(5))


def test_huginn_criteria_match_their_formulas():
    signals = _decode_signals(HUGINN_CFG, HUGINN_W, 4, lambda p: S0[p])
    logps = [torch.log_softmax(logits, -1) for logits, _ in signals]
    states = [S0[len(PROMPT)]] + [s for _, s in signals]
    vocab = logps[0].numel()
    prev = [torch.full_like(logps[0], -math.log(vocab))] + logps[:-1]
    entropy = [math.log(vocab)] + [float(-(lp.exp() * lp).sum()) for lp in logps]
    values = {
        "kl": [float((p.exp() * (p - c)).sum()) for p, c in zip(prev, logps)],
        "entropy-diff": [abs(entropy[r] - entropy[r - 1]) for r in range(1, 5)],
        "latent-diff": [float((states[r] - states[r - 1]).norm() / states[r].norm()) for r in range(1, 5)],
        "cosine": [1 - float(F.cosine_similarity(states[r], states[r - 1], dim=0)) for r in range(1, 5)],
    }
    for mode, vals in values.items():
        for v in vals:
            for threshold in (v * (1 + 1e-7), v * (1 - 1e-7)):
                spec = RefExit(mode, threshold=threshold)
                got = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 2, exit=spec, initial_state=lambda p: S0[p])
                assert got.exit_depths[1] == _first(vals, lambda x: x < threshold, 4), (mode, vals, threshold)
    tops = [int(lp.argmax()) for lp in logps]
    counts = [1]
    for r in range(1, 4):
        counts.append(counts[-1] + 1 if tops[r] == tops[r - 1] else 1)
    for threshold in (1, 2, 3, 4):
        spec = RefExit("argmax-stability", threshold=threshold)
        got = reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 2, exit=spec, initial_state=lambda p: S0[p])
        assert got.exit_depths[1] == _first(counts, lambda c: c >= threshold, 4), (tops, threshold)


def test_ouro_gate_and_lookahead_read_the_normed_state_of_each_loop():
    w = dict(OURO_W)
    w["model.early_exit_gate.weight"] = w["model.early_exit_gate.weight"] * 20
    w["model.early_exit_gate.bias"] = torch.tensor([0.2], dtype=F64)
    states = [h for _, h in _decode_signals(OURO_CFG, w, 4)]
    lam = torch.stack([torch.sigmoid(w["model.early_exit_gate.weight"][0] @ h + 0.2) for h in states])
    cdf = (1 - torch.cumprod(1 - lam, 0)).tolist()
    lw = 0.3 * torch.randn(64, dtype=F64, generator=torch.Generator().manual_seed(2))
    score = [float(torch.sigmoid(lw @ h - 0.1)) for h in states]
    assert len({round(c, 6) for c in cdf}) == 4 and len({round(x, 6) for x in score}) == 4
    for i in range(3):
        for threshold in (cdf[i] * (1 - 1e-9), cdf[i] * (1 + 1e-9)):
            trigger = _first(cdf, lambda c: c >= threshold, 4)
            for mode, depth in (("ouro", trigger), ("ouro_delayed", min(trigger + 1, 4))):
                got = reference_generate(OURO_CFG, w, PROMPT, 2, exit=RefExit(mode, threshold=threshold))
                assert got.exit_depths[1] == depth, (mode, cdf, threshold)
        for threshold in (score[i] * (1 - 1e-9), score[i] * (1 + 1e-9)):
            spec = RefExit("random_lookahead", threshold=threshold, lookahead_weight=lw,
                           lookahead_bias=torch.tensor(-0.1))
            got = reference_generate(OURO_CFG, w, PROMPT, 2, exit=spec)  # exit after the loop following a hit
            assert got.exit_depths[1] == _first(score[:3], lambda x: x >= threshold, 4, start=2), (score, threshold)


@pytest.mark.parametrize("mode", ["kl", "entropy-diff", "latent-diff", "cosine", "argmax-stability"])
def test_huginn_criteria_loop_bounds(mode):
    eager = {"argmax-stability": 1}.get(mode, 1e9)  # always met
    never = {"argmax-stability": 100}.get(mode, 0.0)  # never met
    run = lambda **kw: reference_generate(HUGINN_CFG, HUGINN_W, PROMPT, 3, exit=RefExit(mode, **kw)).exit_depths
    assert run(threshold=eager) == [4, 1, 1]
    assert run(threshold=eager, min_loops=3) == [4, 3, 3]
    assert run(threshold=never) == [4, 4, 4]
    assert run(threshold=never, max_loops=2) == [4, 2, 2]
