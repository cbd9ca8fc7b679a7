"""Plain-data forms of what crosses between an engine front end and its replicas.

Replicas in other processes (or, later, on other machines) receive and return only builtin
values: dicts, lists, strings, numbers, None. `SamplingParams` travels as the dict of its
constructor arguments and is validated again on arrival; a `RequestOutput` travels as nested
dicts and is rebuilt field for field, so floats (logprobs) keep their exact bits.
"""

from __future__ import annotations

import dataclasses

from ..outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from ..sampling_params import SamplingParams


def params_to_dict(params: SamplingParams) -> dict:
    """The constructor arguments of `params` (derived fields left out; nested dataclasses such
    as `guided` as dicts, which the constructor accepts)."""
    data = {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.init}
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in data.items()}


def params_from_dict(data: dict) -> SamplingParams:
    return SamplingParams(**data)


def output_to_dict(out: RequestOutput) -> dict:
    return dataclasses.asdict(out)


def _logprob(data):
    return None if data is None else TokenLogprob(data["logprob"], dict(data["top"]))


def output_from_dict(data: dict) -> RequestOutput:
    completions = []
    for c in data["outputs"]:
        c = dict(c)
        if c["logprobs"] is not None:
            c["logprobs"] = [_logprob(lp) for lp in c["logprobs"]]
        completions.append(CompletionOutput(**c))
    prompt_lps = data["prompt_logprobs"]
    return RequestOutput(**dict(
        data, outputs=completions, metrics=None if data["metrics"] is None else RequestMetrics(**data["metrics"]),
        prompt_logprobs=None if prompt_lps is None else [_logprob(lp) for lp in prompt_lps],
    ))
