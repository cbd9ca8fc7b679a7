"""`LLM`: offline batched generation with a vLLM-shaped API."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from typing import Optional, Sequence, Union

from ..beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams, next_round, round_params, take_round
from ..chat_messages import template_messages
from ..engine.data_parallel import build_engine
from ..engine.llm_engine import eos_token_ids, tokenize_prompt
from ..errors import RequestError
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams

PromptType = Union[str, dict, list]


class LLM:
    """Generate from a looped model.

    model: a checkpoint directory (Hugging Face layout), a Hugging Face Hub name
    (`ByteDance/Ouro-1.4B`; options `revision`, `download_dir`) or a preset name (`ouro-tiny`,
    `huginn-tiny`, `ouro-1.4b`, `ouro-2.6b`, `huginn-0125`). Engine options are keyword
    arguments (see docs/options.md), e.g. `LLM("ouro-1.4b", max_num_seqs=64, kv_layout="shared")`.
    `data_parallel_size=N` runs N engine replicas, one process per GPU (per `tensor_parallel_size`
    GPUs, with the replica's ranks as its own processes), or with `distributed_executor="ray"` one
    Ray actor per `tensor_parallel_size` GPUs of one node of a Ray cluster (docs/distributed.md).
    """

    def __init__(self, model: str, *, dtype: str = "auto", device: str = "auto", seed: int = 0, **engine_options):
        self.engine = build_engine(model, dtype=dtype, device=device, seed=seed, **engine_options)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]], sampling_params: Optional[
            Union[SamplingParams, Sequence[SamplingParams]]] = None, *, use_tqdm: bool = True,
                 trace_ids: Optional[Sequence[str]] = None) -> list[RequestOutput]:
        """Generate for one prompt or a list; returns one RequestOutput per prompt, in order.

        A prompt is a string, a list (or tuple) of token ids, {"prompt_token_ids": [...]} or
        {"prompt": text} (vLLM's TokensPrompt and TextPrompt).
        sampling_params is one SamplingParams for all prompts or one per prompt. Other types are a
        RequestError naming `prompts` or `sampling_params`. trace_ids (one per prompt) set each
        prompt's SamplingParams.trace_id: the exit-trace entry it replays or is recorded under.
        """
        prompts = _prompt_list(prompts)
        params = _per_prompt(sampling_params, len(prompts), self.get_default_sampling_params())
        if trace_ids is not None:
            if isinstance(trace_ids, str) or len(trace_ids) != len(prompts):
                raise RequestError(f"trace_ids must be a list of one trace id per prompt ({len(prompts)}), got {trace_ids!r}")
            params = [dataclasses.replace(p, trace_id=t) for p, t in zip(params, trace_ids)]
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        added = []
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                self.engine.add_request(rid, prompt, p)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            raise
        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm and len(prompts) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(prompts), desc="Generating", unit="prompt")
        while len(results) < len(ids):
            for out in self.engine.step(final_only=True):
                if out.finished and out.request_id not in results:
                    results[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [results[rid] for rid in ids]

    def chat(self, messages: Union[Sequence[Mapping], Sequence[Sequence[Mapping]]], sampling_params: Optional[
            Union[SamplingParams, Sequence[SamplingParams]]] = None, *, use_tqdm: bool = True,
             chat_template: Optional[str] = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: Optional[Mapping] = None,
             tools: Optional[Sequence[Mapping]] = None) -> list[RequestOutput]:
        """Generate an answer for one conversation or a list (vLLM's `LLM.chat`); one RequestOutput
        per conversation, in order, its `prompt` the rendered chat prompt.

        A conversation is a list of OpenAI-style messages (`chat_messages`), rendered by the
        checkpoint's chat template (or `chat_template`) through transformers, with
        add_generation_prompt, continue_final_message and chat_template_kwargs as the server's
        fields of those names; `tools` (OpenAI's function tools) go to the template as the server's
        do (the text is not parsed into tool calls: constrain it with `SamplingParams(guided=...)`
        for that, as the server's tool_choice does). Generation also stops on the template's end-of-turn tokens
        (`<|im_end|>`, `<|end_turn|>`) unless ignore_eos is set. The text is the model's as written
        (a thinking model's `<think>` block included). Bad messages are a RequestError naming the
        field (`messages[0].content`, or `messages[2][0].role` in a list of conversations).
        """
        tok = self.tokenizer
        if tok is None:
            raise RequestError("this checkpoint has no tokenizer: chat needs one (give token ids to generate instead)")
        single = isinstance(messages, (list, tuple)) and (not messages or isinstance(messages[0], Mapping))
        conversations = [messages] if single else list(messages)
        prompts = []
        for k, conversation in enumerate(conversations):
            text = tok.apply_chat_template(template_messages(conversation, "messages" if single else f"messages[{k}]"),
                                           add_generation_prompt=add_generation_prompt,
                                           continue_final_message=continue_final_message, chat_template=chat_template,
                                           template_kwargs=chat_template_kwargs,
                                           tools=[dict(t) for t in tools] if tools else None)
            prompts.append({"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)})
        stops = tok.chat_stop_token_ids
        params = [p if p.ignore_eos else dataclasses.replace(
            p, stop_token_ids=list(p.stop_token_ids or ()) + [t for t in stops if t not in (p.stop_token_ids or ())])
                  for p in _per_prompt(sampling_params, len(prompts), self.get_default_sampling_params())]
        return self.generate(prompts, params, use_tqdm=use_tqdm)

    def beam_search(self, prompts: Union[PromptType, Sequence[PromptType]], params: BeamSearchParams) -> list[
            BeamSearchOutput]:
        """vLLM's `LLM.beam_search` (rlt_runtime/beam_search.py): the best `params.beam_width`
        beams of each prompt (prompts as `generate` takes them), best first. The searches of all
        prompts advance together, each round one batch of one-token requests."""
        prompts = _prompt_list(prompts)
        engine = self.engine
        eos = eos_token_ids(engine.tokenizer, engine.model_config)
        searches = [BeamSearch(tokenize_prompt(p, engine.tokenizer)[1], params, eos, engine.max_model_len)
                    for p in prompts]
        while True:
            rounds, batch = next_round(searches)
            if not batch:
                break
            take_round(searches, rounds, self.generate([{"prompt_token_ids": ids} for ids in batch],
                                                       round_params(params), use_tqdm=False))
        decode = (lambda ids: engine.tokenizer.decode(ids)) if engine.tokenizer is not None else (lambda ids: None)
        return [s.result(decode) for s in searches]

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use without SamplingParams (vLLM's): the defaults of the model's
        generation_config.json (engine option generation_config), else SamplingParams()."""
        return SamplingParams(**self.engine.generation_defaults)

    def update_weights(self, weights) -> None:
        """Write new weights into the model in place, e.g. after a training step: `weights` are
        (hf_name, tensor) pairs, a state dict's `.items()` or any part of it (one layer, one tensor),
        each name and shape checked before anything is written. Call it between `generate` calls;
        the prefix cache is reset."""
        self.engine.update_weights(weights)

    def sleep(self, level: int = 1) -> int:
        """Give back the device memory of the weights and the KV cache between `generate` calls (e.g.
        while a trainer uses the GPU): level 1 keeps the weights in host memory, level 2 discards
        them (refill them with `update_weights` after `wake_up(tags=["weights"])`). Returns the bytes
        given back."""
        return self.engine.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Take back what `sleep` gave: tags among "weights" and "kv_cache" (None: both)."""
        self.engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    def start_profile(self) -> None:
        """Start a torch.profiler trace of what runs next (needs profile_dir; vLLM's `start_profile`)."""
        self.engine.start_profile()

    def stop_profile(self) -> list[str]:
        """Stop it and write the trace into profile_dir: the paths written (one per engine)."""
        return self.engine.stop_profile()

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt prefix; returns the cached blocks dropped."""
        return self.engine.reset_prefix_cache()

    def stats(self) -> dict:
        return self.engine.stats()


def _per_prompt(sampling_params, count: int, default: SamplingParams) -> list[SamplingParams]:
    """One SamplingParams per prompt from None (`default`), one for all, or a list of `count`
    (RequestError naming sampling_params otherwise)."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params or default] * count
    if not isinstance(sampling_params, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in sampling_params):
        raise RequestError("sampling_params must be None, a SamplingParams or a list of them (one per prompt); "
                           f"got {type(sampling_params).__name__}")
    if len(sampling_params) != count:
        raise RequestError(f"got {len(sampling_params)} sampling_params for {count} prompts")
    return list(sampling_params)


def _prompt_list(prompts) -> list:
    """One prompt (a string, token ids or a dict) or a list of them, as a list (RequestError naming
    `prompts` for anything else)."""
    if not isinstance(prompts, (str, dict, list, tuple)):
        raise RequestError("prompts must be a string, a list of token ids, a {'prompt_token_ids': [...]} or "
                           f"{{'prompt': text}} dict, or a list of these; got {type(prompts).__name__}")
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    return list(prompts)
