"""Layers whose MLP output projection splits K (as Ouro-1.4B's down projection does) through the
Triton kernels: the residual norm adds the split linear's partials itself (`linear_residual_norm`),
and fp32 greedy decoding must still give the fp64 dense reference's tokens and exit depths."""

from __future__ import annotations

import pytest
import torch

from rlt_kernels import gemm
from rlt_runtime import LLM, SamplingParams
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.configs import HuginnConfig, OuroConfig
from rlt_runtime.models.dense_reference import RefExit, reference_generate
from rlt_runtime.models.presets import preset_weights

WIDE = gemm.SPLIT_MIN_K  # MLP width: the output projection [hidden, WIDE] splits K
CONFIGS = {
    "ouro": OuroConfig(vocab_size=96, hidden_size=32, intermediate_size=WIDE, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                       total_ut_steps=2, bos_token_id=0, eos_token_id=95),
    "huginn": HuginnConfig(vocab_size=96, n_embd=32, n_heads=2, num_key_value_heads=2, intermediate_size=WIDE,
                           n_layers_in_prelude=1, n_layers_in_recurrent_block=1, n_layers_in_coda=1,
                           mean_recurrence=2, block_size=64, init_scale=0.0, bos_token_id=0, eos_token_id=95,
                           pad_token_id=0),
}
PROMPTS = [[3, 17, 40], [5]]


@pytest.mark.slow  # the op's bits are checked by tests/kernels/test_linear_norm.py in the default suite
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_split_k_output_projection_matches_the_dense_reference(tmp_path, family):
    cfg = CONFIGS[family]
    assert gemm.linear_config(cfg.hidden_size, WIDE, torch.float32).split_k > 1
    save_checkpoint(str(tmp_path), cfg, preset_weights(cfg, seed=3))
    weights = dict(preset_weights(cfg, seed=3, dtype=torch.float64))
    llm = LLM(str(tmp_path), dtype="float32", device="cpu", attention_backend="triton", max_num_seqs=2,
              enable_prefix_caching=False)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params, use_tqdm=False)):
        ref = reference_generate(cfg, weights, prompt, 3, exit=RefExit("fixed"))
        got = out.outputs[0]
        assert (list(got.token_ids), list(got.exit_depths)) == (ref.tokens, ref.exit_depths)
    llm.engine.check_invariants()
