"""`LLM`: offline batched generation with a vLLM-shaped API."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional, Sequence, Union

from ..engine.data_parallel import build_engine
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

        A prompt is a string, a list (or tuple) of token ids, or {"prompt_token_ids": [...]}.
        sampling_params is one SamplingParams for all prompts or one per prompt. Other types are a
        RequestError naming `prompts` or `sampling_params`. trace_ids (one per prompt) set each
        prompt's SamplingParams.trace_id: the exit-trace entry it replays or is recorded under.
        """
        if not isinstance(prompts, (str, dict, list, tuple)):
            raise RequestError("prompts must be a string, a list of token ids, a {'prompt_token_ids': [...]} dict, "
                               f"or a list of these; got {type(prompts).__name__}")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            if not isinstance(sampling_params, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in sampling_params):
                raise RequestError("sampling_params must be None, a SamplingParams or a list of them (one per prompt); "
                                   f"got {type(sampling_params).__name__}")
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise RequestError(f"got {len(params)} sampling_params for {len(prompts)} prompts")
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

    def stats(self) -> dict:
        return self.engine.stats()
