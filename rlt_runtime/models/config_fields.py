"""What rlt does with each config.json field it does not parse into OuroConfig / HuginnConfig.

Besides the fields parsed into the config dataclasses, a published checkpoint's config.json holds:

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

from dataclasses import dataclass


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
