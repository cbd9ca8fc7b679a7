"""A config that loads runs: configs at the edges of every range, and random ones within the
ranges, generate finite log-probabilities.

The engine must not load a config and then fail inside a kernel at the first request (a server
would report healthy and then answer 500s). Each config below sits at the ends of the ranges
config_fields.py allows (the largest head width the attention kernels take, the smallest norm
epsilon fp32 keeps, RoPE bases just above 1 and at the float limit, one loop and the most loops,
a zero initial state) on CPU-sized models; each is written as a checkpoint, loaded through
`LLM(...)` and asked for tokens with their log-probabilities. Hypothesis draws further small
configs anywhere in the ranges (head groupings, widths, RoPE bases, epsilons, loops, token ids).
"""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.models import config_fields
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.configs import CONFIG_CLASSES, HuginnConfig, OuroConfig, config_from_dict
from rlt_runtime.models.presets import preset_weights

JUST_ABOVE_ONE = math.nextafter(1.0, 2.0)

EDGES = {
    "ouro-low": OuroConfig(
        vocab_size=16, hidden_size=2, intermediate_size=1, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=2, rope_theta=JUST_ABOVE_ONE, max_position_embeddings=8,
        rms_norm_eps=config_fields.FP32_TINY, total_ut_steps=1, bos_token_id=0, eos_token_id=[15]),
    "ouro-high": OuroConfig(
        vocab_size=16, hidden_size=16, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=config_fields.MAX_HEAD_DIM, rope_theta=1e308,
        max_position_embeddings=config_fields.INT32_MAX, rms_norm_eps=1.0, total_ut_steps=config_fields.OURO_MAX_LOOPS,
        bos_token_id=15, eos_token_id=15),
    "huginn-low": HuginnConfig(
        vocab_size=16, n_embd=4, n_heads=2, num_key_value_heads=1, intermediate_size=1, n_layers_in_prelude=1,
        n_layers_in_recurrent_block=1, n_layers_in_coda=1, mean_recurrence=1, block_size=8,
        rope_base=JUST_ABOVE_ONE, norm_eps=config_fields.FP32_TINY, qk_bias=False, init_scale=0.0,
        bos_token_id=0, eos_token_id=[15], pad_token_id=0),
    "huginn-high": HuginnConfig(
        vocab_size=16, n_embd=config_fields.MAX_HEAD_DIM, n_heads=1, num_key_value_heads=1, intermediate_size=8,
        n_layers_in_prelude=1, n_layers_in_recurrent_block=1, n_layers_in_coda=1,
        mean_recurrence=config_fields.HUGINN_MAX_LOOPS, block_size=config_fields.INT32_MAX, rope_base=1e308,
        norm_eps=1.0, qk_bias=True, init_scale=1.0, bos_token_id=15, eos_token_id=15, pad_token_id=15),
}


def _generate(directory, cfg, **options):
    """Three greedy tokens with their log-probabilities from a checkpoint of `cfg`; all must be finite."""
    save_checkpoint(directory, cfg, preset_weights(cfg, seed=1))
    # An int32-sized context needs a smaller max_model_len to fit on the device (test_context_memory.py).
    llm = LLM(directory, dtype="float32", max_num_seqs=2, max_model_len=min(cfg.max_model_len, 8), **options)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=2)
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 3 and all(0 <= t < cfg.vocab_size for t in out.token_ids)
    for step in out.logprobs:
        assert math.isfinite(step.logprob) and all(math.isfinite(v) for v in step.top.values()), out.logprobs


@pytest.mark.parametrize("name", sorted(EDGES))
def test_config_at_the_edges_generates(tmp_path, name):
    """The engine's default ops: Triton kernels on CUDA, their torch references on CPU."""
    _generate(str(tmp_path), EDGES[name])


@pytest.mark.parametrize("name, loops", [("ouro-high", {"total_ut_steps": 1}),
                                         pytest.param("huginn-high", {"mean_recurrence": 1}, marks=pytest.mark.slow)])  # ~19 s
def test_widest_heads_run_the_triton_kernels(tmp_path, name, loops):
    """The widest head the ranges allow through the Triton kernels (the interpreter on CPU), one loop."""
    _generate(str(tmp_path), dataclasses.replace(EDGES[name], **loops), attention_backend="triton")


@st.composite
def small_configs(draw):
    """A CPU-sized config.json dict of either family with every parsed field drawn from its range."""
    vocab = draw(st.integers(8, 32))
    kv_heads, group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    head_dim = 2 * draw(st.integers(1, 12))
    token = st.integers(0, vocab - 1)
    common = {
        "vocab_size": vocab, "num_key_value_heads": kv_heads, "intermediate_size": draw(st.integers(1, 16)),
        "bos_token_id": draw(token), "eos_token_id": draw(token | st.lists(token, min_size=1, max_size=3)),
    }
    rope = draw(st.floats(JUST_ABOVE_ONE, 1e308) | st.integers(2, 10**6))
    eps = draw(st.floats(config_fields.FP32_TINY, 1.0))
    context = draw(st.integers(8, 64))
    if draw(st.booleans()):
        return {"model_type": "ouro", **common, "hidden_size": draw(st.integers(1, 16)), "head_dim": head_dim,
                "num_hidden_layers": draw(st.integers(1, 2)), "num_attention_heads": kv_heads * group,
                "rope_theta": rope, "max_position_embeddings": context, "rms_norm_eps": eps,
                "total_ut_steps": draw(st.integers(1, 4)), "tie_word_embeddings": False}
    return {"model_type": "huginn_raven", **common, "n_embd": kv_heads * group * head_dim, "n_heads": kv_heads * group,
            "n_layers_in_prelude": 1, "n_layers_in_recurrent_block": draw(st.integers(1, 2)), "n_layers_in_coda": 1,
            "mean_recurrence": draw(st.integers(1, 4)), "block_size": context, "rope_base": rope, "norm_eps": eps,
            "qk_bias": draw(st.booleans()), "bias": False, "tie_embeddings": True,
            "init_scale": draw(st.floats(0.0, 1.0)), "pad_token_id": draw(token)}


@settings(max_examples=30)
@given(data=small_configs())
def test_any_small_config_in_range_generates(tmp_path_factory, data):
    cfg = config_from_dict(data)
    assert isinstance(cfg, CONFIG_CLASSES[data["model_type"]])
    _generate(str(tmp_path_factory.mktemp("cfg")), cfg)


def test_logprobs_past_the_vocabulary_are_refused(tmp_path):
    """A model with fewer tokens than the 20 log-probabilities a request may ask for: more than the
    vocabulary is a clear request error, and the whole vocabulary is served."""
    from rlt_runtime import RequestError

    cfg = EDGES["ouro-low"]
    save_checkpoint(str(tmp_path), cfg, preset_weights(cfg, seed=1))
    llm = LLM(str(tmp_path), dtype="float32", max_num_seqs=2, max_model_len=8)
    prompt = [{"prompt_token_ids": [1, 2, 3]}]
    with pytest.raises(RequestError, match=r"logprobs must be in 0\.\.16"):
        llm.generate(prompt, SamplingParams(max_tokens=2, logprobs=17), use_tqdm=False)
    out = llm.generate(prompt, SamplingParams(max_tokens=2, logprobs=16, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert all(len(step.top) == 16 for step in out.logprobs)
