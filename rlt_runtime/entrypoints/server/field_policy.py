"""Request fields this server knows without implementing them: the lists, in one place.

A name the request model declares is always handled by the model (declaring a field here makes
its entry below inert, so implementing a field is: add it to the model, drop it from these lists).
Of the other names in a /v1/completions or /v1/chat/completions body:

* IGNORED (OpenAI API fields and vLLM extensions that cannot change what this server does):
  accepted with any value and dropped; the first request that sends one logs a warning naming
  it (once per name and process).
* NEUTRAL_ONLY (vLLM extensions for features this server lacks): accepted at their neutral
  value, dropped; any other value is a 400 `unsupported` naming the field.
* anything else is a 400 `unknown_field` naming it (the model forbids extra fields).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .protocol import ApiError

logger = logging.getLogger("rlt.server")

IGNORED_OPENAI = frozenset({
    "store", "metadata", "service_tier", "reasoning_effort", "modalities", "prompt_cache_key", "safety_identifier",
    "verbosity", "user",
})
IGNORED_VLLM = frozenset({
    "spaces_between_special_tokens",  # byte-level tokenizers put no spaces between tokens
    "cache_salt",  # cached K/V depends on the tokens alone, so sharing it never changes an output
    "request_id", "kv_transfer_params", "vllm_xargs", "mm_processor_kwargs",
    "ec_transfer_params",  # encoder caches of multimodal models: nothing to transfer here
    "return_token_offsets",  # only vLLM's render endpoints answer it
})
IGNORED = IGNORED_OPENAI | IGNORED_VLLM

# name -> its neutral values (a tuple); booleans and numbers compare by type and value.
NEUTRAL_ONLY: dict[str, tuple] = {
    "logits_processors": (None, []),
    "guided_decoding_backend": (None, "xgrammar"), "guided_whitespace_pattern": (None,),
    "logprob_token_ids": (None, []),
    "prompt_embeds": (None,),
}

_warned: set[str] = set()
_lock = threading.Lock()


def _neutral(value: Any, neutral: tuple) -> bool:
    return any(type(value) is type(n) and value == n for n in neutral)


def apply_field_policy(body: Any, declared) -> Any:
    """`body` (a parsed JSON body) without the IGNORED and neutral NEUTRAL_ONLY fields that the
    request model does not declare (`declared`: its field names); raises a 400 `unsupported`
    ApiError for a NEUTRAL_ONLY field at another value. Non-objects pass through unchanged."""
    if not isinstance(body, dict):
        return body
    kept = {}
    for name, value in body.items():
        if name in declared or (name not in IGNORED and name not in NEUTRAL_ONLY):
            kept[name] = value
        elif name in IGNORED:
            _warn_once(name)
        elif not _neutral(value, NEUTRAL_ONLY[name]):
            allowed = " or ".join("null" if n is None else repr(n) for n in NEUTRAL_ONLY[name])
            raise ApiError(400, f"{name} is not supported by this server (only {allowed} is accepted)", name,
                           "unsupported")
    return kept


def _warn_once(name: str) -> None:
    with _lock:
        if name in _warned:
            return
        _warned.add(name)
    logger.warning("rlt-serve: the request field %r has no effect on this server; it is accepted and ignored "
                   "(this warning is logged once)", name)
