"""Outputs of prompts on an `LLM` or on a front end (an engine stepped here), in a form that
compares bit for bit: per sample its token ids, exit depths and log-probabilities."""

from __future__ import annotations

from rlt_runtime import LLM


def outputs_of(llm, prompts: list, params: list) -> list:
    """Each prompt under its SamplingParams: [[(token_ids, exit_depths, logprobs or None) per sample] per prompt]."""
    if isinstance(llm, LLM):
        outs = llm.generate(prompts, params, use_tqdm=False)
    else:
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            llm.add_request(str(i), prompt, p)
        done = {}
        while llm.has_unfinished_requests():
            done.update((int(o.request_id), o) for o in llm.step(final_only=True))
        outs = [done[i] for i in range(len(prompts))]
    return [[(c.token_ids, c.exit_depths, None if c.logprobs is None else [(lp.logprob, sorted(lp.top.items()))
                                                                            for lp in c.logprobs]) for c in o.outputs]
            for o in outs]
