"""Built-in model presets: configs plus deterministic random-init weights.

`ouro-tiny` / `huginn-tiny` are CPU-sized test models (GQA: 4 query heads of 16 over 2 KV heads);
`ouro-1.4b`, `ouro-2.6b` and `huginn-0125` are random-init replicas with the real shapes
(reference/MODELS.md §1.2, §2.1) and the real initialisation (§7, §2.8).

Every tensor is drawn from its own CPU `torch.Generator`, seeded from (seed, tensor name), and
then moved to the target device, one tensor at a time: a preset is the same model on every
device, a 3.5B replica never needs more than its own size plus one fp32 tensor, and the value of
a tensor does not depend on which others are generated.
Values are drawn in fp32 and then cast, so `dtype=bf16` gives exactly the fp32 values rounded.

Huginn GQA configs keep `qk_bias` at [2, 1, n_heads, head_dim]; the k bias uses heads
[0, kv_heads) (the init is zeros either way).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterator

import torch

from ..errors import CheckpointError
from .configs import HuginnConfig, ModelConfig, OuroConfig, hf_weight_shapes


def _huginn_tiny_config() -> HuginnConfig:
    vocab = 320
    top = vocab - 32  # special tokens sit at the top of the vocabulary like Huginn's 65504.. (see tokenizer.py)
    return HuginnConfig(
        vocab_size=vocab, n_embd=64, n_heads=4, num_key_value_heads=2, intermediate_size=128,
        n_layers_in_prelude=1, n_layers_in_recurrent_block=2, n_layers_in_coda=1, mean_recurrence=4,
        block_size=4096, rope_base=10000.0, bos_token_id=top, eos_token_id=[top + 1, top + 4], pad_token_id=top + 5,
    )


PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "ouro-tiny": lambda: OuroConfig(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=10000.0, max_position_embeddings=4096, total_ut_steps=4,
    ),
    "huginn-tiny": _huginn_tiny_config,
    "ouro-1.4b": lambda: OuroConfig(),
    "ouro-2.6b": lambda: OuroConfig(num_hidden_layers=48),
    "huginn-0125": lambda: HuginnConfig(),
}


def preset_config(name: str) -> ModelConfig:
    """The config of preset `name`; unknown names raise CheckpointError listing the presets."""
    if name not in PRESETS:
        raise CheckpointError(f"unknown preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]()


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


def _trunc_normal(out: torch.Tensor, std: float, gen: torch.Generator) -> None:
    torch.nn.init.trunc_normal_(out, mean=0.0, std=std, a=-3.0 * std, b=3.0 * std, generator=gen)


def _init_ouro(name: str, t: torch.Tensor, cfg: OuroConfig, gen: Callable[[], torch.Generator]) -> None:
    """HF default init: normal(0, initializer_range) for Linear/Embedding, norms 1, biases 0."""
    if name.endswith("norm.weight") or "layernorm" in name:
        t.fill_(1.0)
    elif name.endswith(".bias"):
        t.zero_()
    else:
        t.normal_(0.0, cfg.initializer_range, generator=gen())


def _init_huginn(name: str, t: torch.Tensor, cfg: HuginnConfig, gen: Callable[[], torch.Generator]) -> None:
    """Takase init (MODELS.md §2.8): truncated normals at ±3σ, out-projections smaller."""
    std, out_std = cfg.init_std, cfg.out_proj_std
    if ".norm_" in name or name == "transformer.ln_f.weight":
        t.fill_(1.0)
    elif name.endswith("attn.qk_bias"):
        t.zero_()
    elif name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
        _trunc_normal(t, out_std, gen())
    elif name.endswith("mlp.fc.weight"):
        g = gen()
        half = t.shape[0] // 2
        _trunc_normal(t[:half], std, g)  # gate half
        _trunc_normal(t[half:], out_std, g)  # up half
    else:  # wte, Wqkv, adapter
        _trunc_normal(t, std, gen())


def preset_weights(config: ModelConfig, *, seed: int = 0, device="cpu",
                   dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (hf_name, tensor) for every tensor of `hf_weight_shapes(config)`, one at a time.

    Huginn yields no duplicate lm_head and no freqs_cis (tied head, recomputed RoPE).
    """
    device = torch.device(device)
    init = _init_ouro if config.family == "ouro" else _init_huginn
    cpu = torch.device("cpu")
    for name, shape in hf_weight_shapes(config).items():
        # Drawn on the CPU so a preset is the same model on every device, then moved.
        t = torch.empty(shape, device=cpu, dtype=torch.float32)
        init(name, t, config, lambda: _generator(seed, name, cpu))
        yield name, t.to(device=device, dtype=dtype)
