"""rlt-generate: offline generation from the command line.

    rlt-generate --model ouro-tiny --prompt "Hello" --max-tokens 32 --temperature 0
    rlt-generate --model ./Ouro-1.4B --prompt-file prompts.jsonl --json

--prompt-file is JSON lines: each line a string, {"prompt": "..."} or {"prompt_token_ids": [...]}.
--json prints one JSON object per prompt with text, token ids, exit depths and finish reasons.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import RltError
from ..sampling_params import SamplingParams
from .engine_args import add_engine_args, engine_kwargs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlt-generate", description="Generate text with a looped language model.")
    p.add_argument("--model", default="ouro-tiny", help="checkpoint directory, Hugging Face Hub name (namespace/name) or preset name (default ouro-tiny)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompt-file", help="JSON lines file of prompts")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    add_sampling_args(p)
    p.add_argument("--profile", action="store_true", help="record a torch.profiler trace (see --profile-dir)")
    add_engine_args(p)
    return p


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The sampling flags (read back by `sampling_params`), shared with rlt-batch."""
    s = p.add_argument_group("sampling")
    s.add_argument("--n", type=int, default=1)
    s.add_argument("--max-tokens", type=int, default=16)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=-1)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--sampling-seed", type=int, default=None, help="per-request seed (reproducible samples)")
    s.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    s.add_argument("--stop-token-ids", type=int, nargs="+", default=None)
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("--logprobs", type=int, default=None)
    s.add_argument("--min-loops", type=int, default=None)
    s.add_argument("--max-loops", type=int, default=None)
    s.add_argument("--exit-threshold", type=float, default=1.0)
    s.add_argument("--repetition-penalty", type=float, default=1.0)
    s.add_argument("--presence-penalty", type=float, default=0.0)
    s.add_argument("--frequency-penalty", type=float, default=0.0)
    s.add_argument("--logit-bias", type=_logit_bias, default=None, help='JSON object {"token id": bias}')
    s.add_argument("--min-tokens", type=int, default=0)
    s.add_argument("--bad-words", action="append", default=None, help="a word never generated (repeatable)")
    s.add_argument("--best-of", type=int, default=None)
    s.add_argument("--allowed-token-ids", type=int, nargs="+", default=None, help="the only token ids generated")
    s.add_argument("--truncate-prompt-tokens", type=int, default=None,
                   help="keep the last N prompt tokens (-1: as many as the context takes)")
    s.add_argument("--thinking-token-budget", type=int, default=None,
                   help="force </think> once the reasoning holds N tokens")
    s.add_argument("--repetition-detection", type=_json_object, default=None,
                   help='JSON {"max_pattern_size", "min_pattern_size", "min_count"}: stop on a repeated pattern')


def _logit_bias(text: str) -> dict:
    """--logit-bias: a JSON object of token id (a decimal string) to bias."""
    try:
        bias = json.loads(text)
        return {int(k): v for k, v in bias.items()}
    except (json.JSONDecodeError, AttributeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f'expected a JSON object {{"token id": bias}}, got {text!r}') from exc


def _json_object(text: str) -> dict:
    """A flag's JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def read_prompt_file(path) -> list:
    """The prompts of a JSON lines file: each line a string, {"prompt": "..."} (read as the string)
    or {"prompt_token_ids": [...]} (kept as the dict); blank lines skipped."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RltError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            if isinstance(item, dict) and "prompt" in item and "prompt_token_ids" not in item:
                item = item["prompt"]
            prompts.append(item)
    return prompts


def _read_prompts(args) -> list:
    prompts: list = list(args.prompt)
    if args.prompt_file:
        prompts.extend(read_prompt_file(args.prompt_file))
    if not prompts:
        raise RltError("give at least one --prompt or a --prompt-file")
    return prompts


def sampling_params(args) -> SamplingParams:
    """The SamplingParams the sampling flags describe (shared with rlt-batch)."""
    return SamplingParams(
        n=args.n, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, seed=args.sampling_seed, stop=args.stop, stop_token_ids=args.stop_token_ids,
        ignore_eos=args.ignore_eos, logprobs=args.logprobs, min_loops=args.min_loops, max_loops=args.max_loops,
        exit_threshold=args.exit_threshold, repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, logit_bias=args.logit_bias,
        min_tokens=args.min_tokens, bad_words=args.bad_words, best_of=args.best_of,
        allowed_token_ids=args.allowed_token_ids, truncate_prompt_tokens=args.truncate_prompt_tokens,
        thinking_token_budget=args.thinking_token_budget, repetition_detection=args.repetition_detection,
    )


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prompts = _read_prompts(args)
        params = sampling_params(args)
        options = engine_kwargs(args)
        if args.profile:
            options.setdefault("profile_dir", "rlt-profile")
        from ..engine.heap import freeze_heap
        from .llm import LLM

        llm = LLM(args.model, **options)
        freeze_heap()
        outputs = llm.generate(prompts, params, use_tqdm=len(prompts) > 1 and not args.json)
    except (RltError, OSError) as exc:
        print(f"rlt-generate: error: {exc}", file=sys.stderr)
        return 2
    for out in outputs:
        if args.json:
            print(json.dumps({
                "request_id": out.request_id, "prompt": out.prompt, "prompt_token_ids": out.prompt_token_ids,
                "outputs": [{"index": c.index, "text": c.text, "token_ids": c.token_ids, "exit_depths": c.exit_depths,
                             "finish_reason": c.finish_reason,
                             "logprobs": [lp.logprob for lp in c.logprobs] if c.logprobs else None} for c in out.outputs],
            }))
        else:
            for c in out.outputs:
                head = out.prompt if out.prompt is not None else str(out.prompt_token_ids)
                print(f"{head}{c.text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
