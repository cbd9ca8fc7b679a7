"""Tokenizers: a checkpoint's own tokenizer.json, a built-in byte-level one for presets, and
incremental detokenization that never emits a broken UTF-8 character.

The built-in tokenizer maps every byte to one token (a byte-level BPE without merges), so any
text round-trips. Special tokens sit where the real model family has them: Ouro (SmolLM2
layout) 0 `<|endoftext|>` (bos = eos), 1 `<|im_start|>`, 2 `<|im_end|>`, bytes from 3; Huginn
bytes from 0 and `<|begin_text|>` .. `<|pad|>` from `vocab_size - 32` (65504 for the real
65536). Every other id is a reserved special token, so every id below `vocab_size` decodes.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from typing import Iterable, Mapping, Optional, Sequence

from tokenizers import AddedToken, Tokenizer as _RawTokenizer, decoders, models, pre_tokenizers, processors

from ..errors import CheckpointError, ConfigError, RequestError
from .configs import ModelConfig

OURO_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
HUGINN_SPECIALS = ("<|begin_text|>", "<|end_text|>", "<|begin_header|>", "<|end_header|>", "<|end_turn|>", "<|pad|>")
HUGINN_SPECIAL_FROM_TOP = 32  # <|begin_text|> is id vocab_size - 32 (65504 of 65536)
# tokenizer_class written to tokenizer_config.json: a fast tokenizer over tokenizer.json, known to
# AutoTokenizer in transformers 4.x and 5.x.
SAVED_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
# End-of-turn markers a chat completion stops on, when the vocabulary has them.
CHAT_STOP_TOKENS = ("<|im_end|>", "<|end_turn|>")

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
# Huginn's header format; the assistant role is named "Huginn".
HUGINN_TEMPLATE = (
    "{{ '<|begin_text|>' }}"
    "{%- for message in messages -%}"
    "{%- set role = 'Huginn' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<|begin_header|>' + role + '<|end_header|>\\n\\n' + message['content'] + '<|end_turn|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|begin_header|>Huginn<|end_header|>\\n\\n' }}{%- endif -%}"
)


class Tokenizer:
    """A fast tokenizer plus the model's special ids. Wraps `transformers.PreTrainedTokenizerFast`."""

    def __init__(self, backend, config: ModelConfig):
        self._hf = backend
        self._tok = backend.backend_tokenizer
        self._config = config

    @property
    def hf_tokenizer(self):
        """The wrapped `transformers` tokenizer (for libraries that read one, e.g. xgrammar)."""
        return self._hf

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> Optional[int]:
        bos = self._hf.bos_token_id
        return bos if bos is not None else self._config.bos_token_id

    @property
    def eos_token_ids(self) -> tuple:
        """The config's eos ids, then the tokenizer's eos id if it is another one."""
        ids = list(self._config.eos_token_ids)
        if self._hf.eos_token_id is not None:
            ids.append(self._hf.eos_token_id)
        return tuple(dict.fromkeys(ids))

    @property
    def chat_stop_token_ids(self) -> tuple:
        """End-of-turn ids (`<|im_end|>`, `<|end_turn|>`) present in the vocabulary."""
        ids = (self._tok.token_to_id(t) for t in CHAT_STOP_TOKENS)
        return tuple(i for i in ids if i is not None)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._hf.chat_template)

    @property
    def chat_template(self):
        """The checkpoint's chat template (a string, or a {name: template} dict), or None."""
        return self._hf.chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with add_special_tokens the tokenizer's own additions (e.g. BOS)."""
        if not isinstance(text, str):
            raise RequestError(f"prompt text must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(f"prompt text is not valid Unicode (character {exc.start}: lone surrogate)") from exc
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = True, *,
                            continue_final_message: bool = False, chat_template: Optional[str] = None,
                            template_kwargs: Optional[Mapping] = None, tools: Optional[list] = None,
                            documents: Optional[list] = None) -> str:
        """Render chat messages ({"role": str, "content": str, ...}) with transformers' template rendering.

        chat_template: a Jinja template used instead of the tokenizer's own. continue_final_message
        leaves the last message open (the answer continues it; not with add_generation_prompt).
        template_kwargs: extra variables for the template (e.g. enable_thinking); they may not
        shadow the rendering's own arguments. tools: function tools ([{"type": "function", "function":
        {...}}]) for templates that write tool definitions; documents ([{"title": ..., "text": ...}]) for
        retrieval-augmented templates. The result already holds the template's special
        tokens: encode it with add_special_tokens=False.
        """
        if not self.has_chat_template and chat_template is None:
            raise RequestError("this model's tokenizer has no chat template; send a plain prompt instead")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise RequestError("messages must be a non-empty list of {'role': ..., 'content': ...} objects")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise RequestError(f"messages[{i}] must be an object with 'role' and 'content', "
                                   f"got {type(message).__name__}")
            for key in ("role", "content"):
                if key not in message:
                    raise RequestError(f"messages[{i}] has no {key!r} field")
                if not isinstance(message[key], str):
                    raise RequestError(f"messages[{i}]['{key}'] must be a string, got {type(message[key]).__name__}")
            if not message["role"]:
                raise RequestError(f"messages[{i}]['role'] must be a non-empty string")
        if continue_final_message and add_generation_prompt:
            raise RequestError("continue_final_message and add_generation_prompt cannot both be true: one continues "
                               "the last message, the other starts a new assistant message")
        kwargs = dict(template_kwargs or {})
        reserved = sorted(set(kwargs) & _reserved_template_variables(type(self._hf)))
        if reserved:
            raise RequestError(f"chat_template_kwargs may not set {reserved} (the rendering's own arguments; "
                               "use the request fields)")
        try:
            return self._hf.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                add_generation_prompt=add_generation_prompt,
                                                continue_final_message=continue_final_message,
                                                chat_template=chat_template, tools=tools or None,
                                                documents=documents or None, **kwargs)
        except Exception as exc:  # jinja2 TemplateError and friends: report, keep the engine alive
            raise RequestError(f"chat template failed: {exc}") from exc

    def save(self, model_dir: str) -> None:
        """Write tokenizer.json / tokenizer_config.json (chat template embedded in the latter).

        The config names the class SAVED_TOKENIZER_CLASS, which AutoTokenizer resolves in
        transformers 4.x and 5.x alike (5.x alone writes its own "TokenizersBackend")."""
        self._hf.save_pretrained(model_dir)
        path = os.path.join(model_dir, "tokenizer_config.json")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        data["tokenizer_class"] = SAVED_TOKENIZER_CLASS
        if self.has_chat_template:  # older transformers read the template only from tokenizer_config.json
            data["chat_template"] = self._hf.chat_template
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)


@functools.lru_cache(maxsize=None)
def _reserved_template_variables(backend_type) -> frozenset:
    """Names extra template variables may not take: apply_chat_template's own parameters (read from
    transformers' signature) and `messages`."""
    params = inspect.signature(backend_type.apply_chat_template).parameters.values()
    named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"self"}
    return frozenset(named | {"messages"})


def load_tokenizer(model_dir: str, config: ModelConfig) -> Optional[Tokenizer]:
    """The checkpoint's tokenizer (tokenizer.json, no remote code), or None when it has none."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        others = [f for f in ("tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")
                  if os.path.isfile(os.path.join(model_dir, f))]
        if others:
            raise CheckpointError(f"{model_dir}: tokenizer files {others} found but no tokenizer.json; "
                                  f"only the fast tokenizer.json format is supported")
        return None
    from transformers import PreTrainedTokenizerFast

    try:
        backend = PreTrainedTokenizerFast.from_pretrained(model_dir, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot load tokenizer ({exc})") from exc
    return Tokenizer(backend, config)


def _byte_symbols() -> list[str]:
    """The symbol byte-level BPE uses for each byte 0..255: printable latin-1 bytes stand for
    themselves, the others map to chr(256), chr(257), ... in byte order."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), 256))
    symbols, shifted = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    if set(symbols) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("the tokenizers library's byte-level alphabet differs from the expected one")
    return symbols


def builtin_tokenizer(config: ModelConfig) -> Tokenizer:
    """A byte-level tokenizer laid out like the model family's (see the module docstring)."""
    from transformers import PreTrainedTokenizerFast

    vocab_size = config.vocab_size
    if config.family == "ouro":
        specials = dict(enumerate(OURO_SPECIALS))
        first_byte, template = len(OURO_SPECIALS), CHATML_TEMPLATE
        bos = eos = OURO_SPECIALS[0]
        pad = None
    else:
        top = vocab_size - HUGINN_SPECIAL_FROM_TOP
        specials = {top + i: name for i, name in enumerate(HUGINN_SPECIALS)}
        first_byte, template = 0, HUGINN_TEMPLATE
        bos, eos, pad = HUGINN_SPECIALS[0], HUGINN_SPECIALS[1], HUGINN_SPECIALS[5]
    needed = first_byte + 256 + (HUGINN_SPECIAL_FROM_TOP if config.family == "huginn" else 0)
    if vocab_size < needed:
        raise ConfigError(f"vocab_size must be at least {needed} for the built-in {config.family} tokenizer "
                          f"(256 bytes plus special tokens), got {vocab_size}")
    vocab = {symbol: first_byte + i for i, symbol in enumerate(_byte_symbols())}
    taken = set(vocab.values()) | set(specials)
    names = dict(specials)
    names.update({i: f"<|reserved_{i}|>" for i in range(vocab_size) if i not in taken})
    vocab.update({name: i for i, name in names.items()})

    raw = _RawTokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([AddedToken(names[i], special=True, normalized=False) for i in sorted(names)])
    if config.family == "huginn":  # Huginn documents start with <|begin_text|>
        raw.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, vocab[bos])])
    backend = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=bos, eos_token=eos, pad_token=pad)
    backend.chat_template = template
    return Tokenizer(backend, config)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas without ever splitting a UTF-8 character.

    `add(id)` returns only newly completed text; bytes of an incomplete character (which decode
    as U+FFFD at the end of the window) are held back until a later token completes them.
    `flush()` returns whatever is left. The concatenation of all deltas equals the decode of the
    whole id sequence (after the prompt). Special tokens are skipped unless `skip_special_tokens`
    is False.
    """

    _CONTEXT = 5  # prompt tokens kept as decoding context for the first delta
    # Shorter batches add_many tries when a batch's text ends inside a character: an unfinished
    # character is at most 3 bytes, and skipped special tokens after it add cuts that change nothing.
    _MAX_CUTS = 8

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Optional[Sequence[int]] = None, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_ids or ())
        self._prefix = max(len(self._ids) - self._CONTEXT, 0)  # window start (a character boundary)
        self._read = len(self._ids)  # ids[:read] are already emitted

    def add(self, token_id: int) -> str:
        return self.add_many([token_id])

    def add_many(self, token_ids: Sequence[int]) -> str:
        """Feed ids; returns the newly completed text: that of the longest batch of them that ends
        on a whole character (one decode when all of them do), looking back at most _MAX_CUTS
        ids. The ids after it are held back (each longer batch ends inside a character), all of
        them if no batch looked at ends on a whole character: later ids or the flush emit them."""
        ids = [int(t) for t in token_ids]
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read], self._skip)
        window = self._ids[self._prefix:]
        for cut in range(len(ids), max(len(ids) - self._MAX_CUTS, 0), -1):
            text = self._tok.decode(window + ids[:cut], self._skip)
            if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
                self._ids.extend(ids)
                self._prefix, self._read = self._read, len(self._ids) - (len(ids) - cut)
                return text[len(prefix_text):]
        self._ids.extend(ids)  # held back until later ids complete the character
        return ""

    def flush(self) -> str:
        """The text of tokens still held back (possibly with replacement characters)."""
        if self._read == len(self._ids):
            return ""
        prefix_text = self._tok.decode(self._ids[self._prefix:self._read], self._skip)
        text = self._tok.decode(self._ids[self._prefix:], self._skip)
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):]
