"""rlt-batch: offline generation of a large prompt set on Ray Data, one engine actor per GPU.

    rlt-batch --model ./Ouro-1.4B --prompt-file prompts.jsonl --output results.jsonl --max-tokens 256
    rlt-batch --model ouro-tiny --device cpu --prompt-file prompts.jsonl --output out.jsonl --concurrency 2

The prompts become a Ray Dataset; `map_batches` sends each batch of `batch_size` prompts to one of
`concurrency` actors (`EngineBatch`), each holding one LLMEngine on its own GPU (or share of the
CPUs), which runs the batch to completion with continuous batching. Results come back in input
order (reordered by prompt index as the actors finish batches), as JSON lines, one per prompt:
{"index", "prompt", "text", "token_ids", "exit_depths", "finish_reason", "cumulative_logprob"}.

Each prompt runs with its position in the input as its arrival index, so its result is that of
one engine given the whole list in order (`LLM.generate`) — greedy, seeded or unseeded — whichever
actor runs it (batch invariance). Sampling flags are those of rlt-generate; `n` must be 1.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
from typing import Iterable, Iterator, Optional, Sequence, Union

from ..config import EngineConfig
from ..engine.heap import freeze_heap
from ..errors import ConfigError, RequestError, RltError
from ..sampling_params import SamplingParams
from .cli import add_sampling_args, read_prompt_file, sampling_params
from .engine_args import add_engine_args, engine_kwargs

DEFAULT_BATCH_SIZE = 256  # prompts one actor takes at a time (at least max_num_seqs keeps its engine full)


class EngineBatch:
    """A `map_batches` callable class: one LLMEngine per Ray Data actor.

    A batch is a dict of columns: "index" (int64, the prompts' positions in the input) and
    "prompt" (str) or "prompt_token_ids" (lists of ints). Returns the result columns
    (`RESULT_COLUMNS`) in the batch's row order.
    """

    def __init__(self, model: str, options: dict, params: dict, device: str, num_threads: int):
        import torch

        from ..engine.llm_engine import LLMEngine
        from ..engine.wire import params_from_dict

        if num_threads:
            torch.set_num_threads(num_threads)
        self.engine = LLMEngine(model, EngineConfig.from_kwargs(**dict(options, device=device)))
        freeze_heap()
        self.params = params_from_dict(params)

    def __call__(self, batch: dict) -> dict:
        indices = [int(i) for i in batch["index"]]
        if "prompt" in batch:
            prompts = [str(p) for p in batch["prompt"]]
        else:
            prompts = [{"prompt_token_ids": [int(t) for t in ids]} for ids in batch["prompt_token_ids"]]
        for index, prompt in zip(indices, prompts):
            self.engine.add_request(str(index), prompt, self.params, arrival_index=index)
        done = {}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step(final_only=True):
                done[out.request_id] = out
        outs = [done[str(i)] for i in indices]
        samples = [o.outputs[0] for o in outs]
        return {
            "index": indices,
            "prompt": [o.prompt for o in outs],
            "text": [c.text for c in samples],
            "token_ids": [list(c.token_ids) for c in samples],
            "exit_depths": [list(c.exit_depths) for c in samples],
            "finish_reason": [c.finish_reason for c in samples],
            "cumulative_logprob": [c.cumulative_logprob for c in samples],
        }


RESULT_COLUMNS = ("index", "prompt", "text", "token_ids", "exit_depths", "finish_reason", "cumulative_logprob")


def _prompt_rows(prompts: Sequence) -> list[dict]:
    """Rows {"index", "prompt"} or {"index", "prompt_token_ids"}: all prompts text or all token ids."""
    rows = []
    for i, p in enumerate(prompts):
        if isinstance(p, dict) and "prompt_token_ids" in p:
            p = p["prompt_token_ids"]
        if isinstance(p, str):
            rows.append({"index": i, "prompt": p})
        elif isinstance(p, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            rows.append({"index": i, "prompt_token_ids": list(p)})
        else:
            raise RequestError(f"prompts[{i}] must be a string, a list of token ids or {{'prompt_token_ids': [...]}}, "
                               f"got {type(p).__name__}")
    if len({tuple(r) for r in rows}) > 1:
        raise RequestError("give every prompt as text or every prompt as token ids (a batch column has one type)")
    return rows


def generate_batch(model: str, prompts: Union[Sequence, str, os.PathLike, "ray.data.Dataset"],  # noqa: F821
                   sampling_params: Optional[SamplingParams] = None, *, output_path: Optional[str] = None,
                   concurrency: Optional[int] = None, batch_size: int = DEFAULT_BATCH_SIZE, use_tqdm: bool = True,
                   **engine_options) -> Union[list[dict], int]:
    """Generate for every prompt on Ray Data; results in input order (ascending index).

    prompts: a list (strings, token-id lists or {"prompt_token_ids": [...]} dicts), a path of a JSON
    lines file in rlt-generate's --prompt-file format, or a Ray Dataset with an "index" column
    (distinct integers, best 0..N-1: request ids, arrival indices and the output order) and a
    "prompt" or "prompt_token_ids" column.
    concurrency: engine actors (default: one per tensor_parallel_size GPUs of the cluster, or one
    actor on the CPUs); each takes tensor_parallel_size GPUs (`num_gpus`) or an equal share of the
    cluster's CPUs.
    Returns the result rows (dicts with RESULT_COLUMNS) or, with output_path, writes them there as
    JSON lines and returns how many.
    """
    from ..engine.ray_replica import connect_ray, placement
    from ..engine.wire import params_to_dict

    params = sampling_params or SamplingParams()
    if not isinstance(params, SamplingParams):
        raise RequestError("sampling_params must be a SamplingParams")
    if params.n != 1:
        raise RequestError(f"sampling_params.n must be 1 in the batch path (one result row per prompt), got "
                           f"{params.n}; repeat the prompt with different seeds instead")
    cfg = EngineConfig.from_kwargs(**engine_options)
    cfg.validate_static()
    if cfg.data_parallel_size != 1 or cfg.distributed_executor != "mp":
        raise ConfigError("the batch path runs one engine per actor: set concurrency (engine actors) instead of "
                          "data_parallel_size or distributed_executor")
    if batch_size is None or isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    ray = connect_ray()
    import ray.data

    if concurrency is None:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        concurrency = max(1, gpus // cfg.tensor_parallel_size) if cfg.device in ("auto", "cuda") and gpus else 1
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ConfigError(f"concurrency must be a positive integer (engine actors), got {concurrency!r}")
    device, resources, threads = placement(cfg.device, concurrency, cfg.tensor_parallel_size, ray)

    total = None
    if isinstance(prompts, ray.data.Dataset):
        dataset = prompts
        columns = set(dataset.columns() or ())
        if "index" not in columns or not columns & {"prompt", "prompt_token_ids"}:
            raise RequestError(f"a Ray Dataset of prompts needs an 'index' column and a 'prompt' or 'prompt_token_ids' "
                               f"column, got {sorted(columns)}")
    else:
        if isinstance(prompts, (str, os.PathLike)):
            prompts = read_prompt_file(prompts)
        rows = _prompt_rows(prompts)
        total = len(rows)
        if not rows:
            return 0 if output_path else []
        dataset = ray.data.from_items(rows, override_num_blocks=min(len(rows), max(1, -(-len(rows) // batch_size))))

    results = dataset.map_batches(
        EngineBatch, fn_constructor_kwargs={"model": model, "options": _engine_options(cfg),
                                            "params": params_to_dict(params), "device": device, "num_threads": threads},
        batch_size=batch_size, concurrency=concurrency, batch_format="numpy", **resources)
    bar = None
    if use_tqdm:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="Generating", unit="prompt")
    out: list[dict] = []
    count = 0
    sink = open(output_path, "w", encoding="utf-8") if output_path else None
    try:
        for record in _in_index_order({k: _plain(row[k]) for k in RESULT_COLUMNS} for row in results.iter_rows()):
            if sink is not None:
                sink.write(json.dumps(record) + "\n")
            else:
                out.append(record)
            count += 1
            if bar is not None:
                bar.update(1)
    finally:
        if sink is not None:
            sink.close()
        if bar is not None:
            bar.close()
    return count if output_path else out


def _in_index_order(records: Iterable[dict]) -> Iterator[dict]:
    """Records arriving in any order, yielded by ascending "index": index k as soon as 0..k have
    all arrived, so 0..N-1 stream out while later batches still run (held back: the records that
    arrived ahead of a missing one); indices outside such a run come last, in ascending order."""
    waiting: list = []
    following = 0
    for record in records:
        heapq.heappush(waiting, (record["index"], id(record), record))
        while waiting and waiting[0][0] == following:
            following += 1
            yield heapq.heappop(waiting)[2]
    while waiting:
        yield heapq.heappop(waiting)[2]


def _engine_options(cfg: EngineConfig) -> dict:
    """The engine options each actor builds its engine from, as plain data."""
    import dataclasses

    out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "extra"}
    if out["speculative_config"] is not None:
        out["speculative_config"] = dataclasses.asdict(out["speculative_config"])
    return out


def _plain(value):
    """A Ray Data value as JSON-ready builtins (numpy arrays and scalars to lists and numbers)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlt-batch", description="Generate for a large prompt set on Ray Data (one "
                                "engine actor per GPU), results in input order.")
    p.add_argument("--model", default="ouro-tiny", help="checkpoint directory, Hugging Face Hub name or preset name")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompt-file", help="JSON lines file of prompts (as rlt-generate's)")
    b = p.add_argument_group("batch")
    b.add_argument("--output", required=True, help="JSON lines file of results, one per prompt in input order")
    b.add_argument("--concurrency", type=int, default=None,
                   help="engine actors (default: every GPU of the Ray cluster, or one on the CPUs)")
    b.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="prompts an actor takes at a time")
    add_sampling_args(p)
    add_engine_args(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        prompts = list(args.prompt) + (read_prompt_file(args.prompt_file) if args.prompt_file else [])
        if not prompts:
            raise RltError("give at least one --prompt or a --prompt-file")
        count = generate_batch(args.model, prompts, sampling_params(args), output_path=args.output,
                               concurrency=args.concurrency, batch_size=args.batch_size, **engine_kwargs(args))
    except (RltError, OSError) as exc:
        print(f"rlt-batch: error: {exc}", file=sys.stderr)
        return 2
    print(f"rlt-batch: wrote {count} results to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
