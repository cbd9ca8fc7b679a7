"""What rlt does with each config.json field: parsed fields' types and ranges, and every other field.

Parsed fields (`ParsedField`, tables OURO_PARSED / HUGINN_PARSED) go into OuroConfig /
HuginnConfig; each has a JSON type and a range (sizes positive integers, floats finite and in the
range the kernels compute with, booleans strictly true/false) and the config refuses any other
value, naming the field. Besides them, a published checkpoint's config.json holds:

* math fields (`MathField`): they change the forward pass and rlt implements only some values
  (e.g. Huginn's `norm_class_name` "RMSNorm_llama"); any other value is refused, naming the field
  and the values allowed;
* checked fields: copies or functions of parsed fields (Huginn's `head_dim` = n_embd / n_heads);
  they must agree with what rlt computes (checked in configs.py);
* no-math fields: initialisation, training, bookkeeping and HF generate() defaults; accepted with
  any value and ignored (each with the reason it cannot change an output).

Any other field is unknown and refused by name: it might change the outputs. docs/options.md
("config.json fields") lists the same tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..errors import ConfigError


def same_value(a, b) -> bool:
    """JSON equality that keeps booleans apart from numbers (false is not 0)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


@dataclass(frozen=True)
class MathField:
    """A field that changes the forward pass; rlt implements only the values `allowed`."""

    allowed: tuple
    meaning: str

    def accepts(self, value) -> bool:
        return any(same_value(value, allowed) for allowed in self.allowed)

    def describe(self) -> str:
        return " or ".join(repr(v) for v in self.allowed)


def shown(value, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters (a config value can be arbitrarily large)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# Sizes, positions and block indices are int32 on the device.
INT32_MAX = 2**31 - 1
# The smallest normal fp32: the kernels add the norm epsilon in fp32, where a smaller one is 0.
FP32_TINY = 2.0**-126
# The attention kernels handle head dimensions up to this (rlt_kernels.attention).
MAX_HEAD_DIM = 256
OURO_MAX_LOOPS = 8
# Layers are listed tensor by tensor when a checkpoint is validated and run one by one from the
# host; the published models have 8 to 48. A bound keeps a mistyped count from listing billions.
MAX_LAYERS = 1024
HUGINN_MAX_LOOPS = 128


@dataclass(frozen=True)
class ParsedField:
    """A field parsed into the config: its JSON type (`kind`) and range.

    kind "int": an integer (not a boolean) in [low, high], a multiple of `step`;
    "float": a finite number (integers too, not booleans) above `low` (or at least `low` when
    `low_closed`) and at most `high`; "bool": true or false only; "token_id": an integer >= 0
    (configs.py checks it against vocab_size); "token_ids": a token id or a non-empty list of them.
    """

    kind: str
    meaning: str
    low: Optional[float] = None
    high: Optional[float] = None
    low_closed: bool = True
    step: int = 1

    def describe(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "token_id":
            return "a token id (an integer in 0..vocab_size - 1)"
        if self.kind == "token_ids":
            return "a token id or a non-empty list of token ids (integers in 0..vocab_size - 1)"
        if self.kind == "int":
            text = f"an integer in {self.low}..{self.high}"
            return text + (f", a multiple of {self.step}" if self.step > 1 else "")
        low = f"{'>=' if self.low_closed else '>'} {self.low!r}"
        return f"a finite number {low}" + (f" and <= {self.high!r}" if self.high is not None else "")

    def accepts(self, value) -> bool:
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "token_ids" and isinstance(value, list):
            return bool(value) and all(_is_int(v) and v >= 0 for v in value)
        if self.kind in ("token_id", "token_ids"):
            return _is_int(value) and value >= 0
        if self.kind == "int":
            return _is_int(value) and self.low <= value <= self.high and value % self.step == 0
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        try:
            number = float(value)  # an integer too large for a float is out of every range
        except OverflowError:
            return False
        return (math.isfinite(number) and (number >= self.low if self.low_closed else number > self.low)
                and (self.high is None or number <= self.high))

    def check(self, name: str, value) -> None:
        """Raise ConfigError naming `name` unless `value` has this field's type and range."""
        if not self.accepts(value):
            raise ConfigError(f"field {name!r} = {shown(value)} must be {self.describe()} ({self.meaning})")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size(meaning: str, low: int = 1, high: int = INT32_MAX) -> ParsedField:
    return ParsedField("int", meaning, low, high)


_ROPE = ParsedField("float", "the RoPE base: angle(p, i) = p * base^(-2i/head_dim); at or below 1 the "
                             "frequencies no longer fall with i", low=1.0, low_closed=False)
_EPS = ParsedField("float", "the RMSNorm epsilon, added in fp32 to the mean square; the smallest normal fp32 "
                            "keeps an all-zero row finite, above 1 it outweighs unit-scale activations",
                   low=FP32_TINY, high=1.0)
_TOKEN_IDS = {
    "bos_token_id": ParsedField("token_id", "the beginning-of-sequence id"),
    "eos_token_id": ParsedField("token_ids", "the end-of-sequence id(s) generation stops on"),
}

OURO_PARSED = {
    "vocab_size": _size("rows of the embedding and the LM head"),
    "hidden_size": _size("the residual width"),
    "intermediate_size": _size("the MLP width"),
    "num_hidden_layers": _size("layers in one loop", high=MAX_LAYERS),
    "num_attention_heads": _size("query heads"),
    "num_key_value_heads": _size("key/value heads; num_attention_heads must be a multiple"),
    "head_dim": ParsedField("int", f"the attention head width: even for RoPE, at most {MAX_HEAD_DIM} for the "
                                   "attention kernels", 2, MAX_HEAD_DIM, step=2),
    "rope_theta": _ROPE,
    "max_position_embeddings": _size("the context length; positions are int32 on the device"),
    "rms_norm_eps": _EPS,
    "total_ut_steps": _size("loops of the layer stack", high=OURO_MAX_LOOPS),
    **_TOKEN_IDS,
    "initializer_range": ParsedField("float", "the std of the presets' random init", low=0.0, low_closed=False),
    "tie_word_embeddings": ParsedField("bool", "must be false: the Ouro checkpoints untie lm_head"),
}
HUGINN_PARSED = {
    "vocab_size": _size("rows of the embedding (the tied LM head)"),
    "n_embd": _size("the residual width; n_heads must divide it"),
    "n_heads": _size("query heads"),
    "num_key_value_heads": _size("key/value heads; n_heads must be a multiple"),
    "intermediate_size": _size("the MLP width"),
    "n_layers_in_prelude": _size("prelude blocks", high=MAX_LAYERS),
    "n_layers_in_recurrent_block": _size("core blocks, looped mean_recurrence times", high=MAX_LAYERS),
    "n_layers_in_coda": _size("coda blocks", high=MAX_LAYERS),
    "mean_recurrence": _size("loops of the core block", high=HUGINN_MAX_LOOPS),
    "block_size": _size("the context length; positions are int32 on the device"),
    "rope_base": _ROPE,
    "norm_eps": _EPS,
    "qk_bias": ParsedField("bool", "whether the blocks carry q/k biases"),
    "bias": ParsedField("bool", "must be false: Huginn-0125 has q/k biases only"),
    "tie_embeddings": ParsedField("bool", "must be true: lm_head is the embedding"),
    "init_scale": ParsedField("float", "the initial state's std as a fraction of Huginn's: 0 gives a zero state, "
                                       "1 the published model's", low=0.0, high=1.0),
    **_TOKEN_IDS,
    "pad_token_id": ParsedField("token_id", "the padding id"),
}


def _ignored(reason: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, reason)


# Fields any transformers PretrainedConfig may write (to_json_string with or without use_diff).
PRETRAINED_MATH = {
    "pruned_heads": MathField(({},), "attention heads removed after training"),
    "is_encoder_decoder": MathField((False,), "an encoder-decoder model"),
    "add_cross_attention": MathField((False,), "cross-attention layers"),
}
PRETRAINED_NO_MATH = {
    **_ignored("transformers bookkeeping (class names, remote-code modules, version, origin)",
               "architectures", "auto_map", "transformers_version", "_name_or_path"),
    **_ignored("storage dtype hint; rlt's `dtype` option sets the dtype", "torch_dtype", "dtype", "use_bfloat16"),
    **_ignored("switches of the HF Python API (KV cache, outputs, export, chunked FF of equal result)",
               "use_cache", "return_dict", "output_hidden_states", "output_attentions", "torchscript",
               "tf_legacy_loss", "chunk_size_feed_forward"),
    **_ignored("task-head, encoder-decoder and tokenizer metadata a causal LM does not read",
               "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "task_specific_params",
               "prefix", "tokenizer_class", "is_decoder", "tie_encoder_decoder", "cross_attention_hidden_size",
               "sep_token_id", "decoder_start_token_id"),
    **_ignored("defaults of HF generate(); rlt takes sampling from each request (SamplingParams)",
               "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
               "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
               "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
               "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
               "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
               "suppress_tokens", "begin_suppress_tokens"),
}

_DEFAULT_ROPE = ({"rope_type": "default"}, {"type": "default"}, {"rope_type": "default", "type": "default"})

OURO_MATH = {
    **PRETRAINED_MATH,
    "hidden_act": MathField(("silu",), "the MLP activation of SwiGLU"),
    "rope_scaling": MathField((None, *_DEFAULT_ROPE), "RoPE frequency scaling, which rlt does not apply"),
    "use_sliding_window": MathField((False,), "sliding-window attention"),
    "attention_bias": MathField((False,), "biases on the q/k/v/o projections"),
    "mlp_bias": MathField((False,), "biases in the MLP"),
    "early_exit_threshold": MathField(
        (1.0,), "the default exit threshold of HF generation; rlt takes it per request: "
                "SamplingParams.exit_threshold, --exit-threshold"),
    "early_exit_step": MathField(
        (None,), "a forced exit step; rlt bounds loops per request: SamplingParams.max_loops, min_loops"),
}
OURO_CHECKED = {"layer_types": "'full_attention' for each of the num_hidden_layers layers"}
OURO_NO_MATH = {
    **PRETRAINED_NO_MATH,
    "attention_dropout": "dropout, inactive at inference",
    **_ignored("read only for sliding-window layers, which rlt refuses (use_sliding_window, layer_types)",
               "sliding_window", "max_window_layers"),
    "chunk_size": "read by the HF code but never used",
    "pad_token_id": "padding id; rlt never runs padding through the model",
}

HUGINN_MATH = {
    **PRETRAINED_MATH,
    "architecture_class_name": MathField(("RecurrentGPT",), "the model class"),
    "block_class_name": MathField(("SandwichBlock",), "the block: four RMSNorms, residual sums normalised"),
    "norm_class_name": MathField(("RMSNorm_llama",), "the norm: RMSNorm in fp32, cast, then the weight"),
    "mlp_class_name": MathField(("GatedMLP",), "the MLP: SwiGLU from one fused fc"),
    "nonlin_name": MathField(("SiLU",), "the MLP activation"),
    "injection_type": MathField(("linear",), "how the embedding enters each recurrence: adapter on [state, e]"),
    "state_init": MathField(("like-init",),
                            "the initial state: truncated normal of std init_values['std'], times sqrt(n_embd)"),
    "test_time_noise": MathField((0,), "noise added to the state at each recurrence"),
}
HUGINN_CHECKED = {
    "head_dim": "n_embd / n_heads",
    "n_layers": "n_layers_in_prelude + n_layers_in_recurrent_block + n_layers_in_coda",
    "num_hidden_layers": "n_layers_in_prelude + n_layers_in_recurrent_block + n_layers_in_coda",
    "padded_vocab_size": "vocab_size",
    "tie_word_embeddings": "tie_embeddings",
    "init_values": "'std' = sqrt(2 / (5 n_embd)) and 'embed_scale' = sqrt(n_embd); 'embedding', 'out_proj' "
                   "are init-only",
}
# RavenConfig.attribute_map: the alias is parsed into its target; both present must agree.
HUGINN_ALIASES = {"hidden_size": "n_embd", "num_attention_heads": "n_heads"}
HUGINN_NO_MATH = {
    **PRETRAINED_NO_MATH,
    "padding_multiple": "vocabulary padding when training; vocab_size is already the padded size",
    **_ignored("weight initialisation only", "init_strategy", "init_orthogonal", "effective_expected_depth"),
    **_ignored("training only (recurrence sampling, truncated backprop, activation checkpointing)",
               "sampling_scheme", "mean_backprop_depth", "activation_checkpoint_impl"),
    "test_time_noise_type": "read only when test_time_noise > 0, which rlt refuses",
    **_ignored("model name and hub location in the repository's own json", "name", "hf_config"),
}
