"""One conformance case, run in its own process: a crowd of requests through the engine under
test, then the same requests each alone in eager mode (and the fp64 dense reference), compared
bit for bit.

    python -m perf.conformance_case CASE.json RESULT.json

CASE.json is one case of `perf.conformance` (a flat dict of options, see `perf/conformance.py`).
RESULT.json gets {"status": "pass" | "fail" | "config-error", "detail": the first problem (for a
differing output token, with what committed it in the crowd and alone: `CommitTrace`),
"problems": every problem, "checks": what was compared, "stats": {...}, and with adaptive
speculation "round_drafts": the greedy rounds' draft counts (`DraftTape`)} (the runner turns a
config-error into not-applicable or fail). A crash (a Python exception, a device fault,
os.abort) leaves no result: the runner records the exit code and the stderr tail.

Equalities checked (the ones docs/design.md and README.md promise):
* every request's token ids, exit depths, finish reason and log-probabilities (chosen and top-N,
  compared as exact float bits) equal those of the same request run alone in an eager, synchronous
  engine without speculation, whatever the batch, arrival pattern, chunk size, prefix cache,
  preemption, LAST_EXITED read mode, execution mode, async scheduling or greedy speculation;
* a sampled request under speculation equals itself alone in an eager, synchronous engine with the
  same speculative config (sampled rounds commit different bits than plain sampling, and its draft
  counts must be the same, which the matrix guarantees: see `perf.conformance`);
* requests that draw the case's per-request features (`perf.conformance.FEATURES` and
  `LATE_FEATURES`: penalties, logit_bias + min_tokens + bad_words, prompt_logprobs, best_of > n,
  guided decoding, allowed_token_ids, thinking_token_budget: those prompts end with `<think>`) take
  part in
  the comparison with all their outputs (prompt log-probabilities included: the crowd's chunking
  and the alone engine's differ), FP8 weights and K/V (quantization / kv_cache_dtype) too;
* fp32 greedy requests produce the fp64 dense reference's tokens and exit depths (its argmax taken
  over `reference_logit_processing` of each step's logits for requests with logit processing;
  guided and thinking-budget requests and FP8 cases are left out, they have no fp64 counterpart);
* every guided sample ends with the grammar ("stop") and its text matches the regex or parses as
  JSON of the schema; every unguided thinking-budget sample starts `</think>` by its budget;
* with `split_keys` (64-key attention ranges and a shared preamble that carries every request past
  one range) the same equalities hold where decode and prefill attention split their keys;
* with `new_weights` every engine of the case (the crowd after a two-token warm-up run, so its
  graphs are captured and a prefix cached) switches to other weights by `LLM.update_weights` (in two parts;
  with `sleep` the crowd does so asleep: level 2, the weights woken and refilled, then the KV
  cache woken), and the fp64 reference uses them too;
* with `replay_drafts` (a failed crowd's `round_drafts`, `DraftTape`) the crowd's greedy rounds
  take those draft counts, so a run alone repeats the composition of rounds a run beside other
  cases took by its timings;
* the block/slot invariants hold after every step, the KV pool is full again at the end, no graph
  capture failed (a mode that fell back to eager proves nothing), and fixed-K speculation ran rounds (when a request could draft).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import random
import sys
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# Faults a case may plant to test the harness itself (tests/runtime/test_conformance.py); the
# matrix never sets one. flip-token: alter one output token of the crowd run before the comparison;
# abort: os.abort() at start; hang: sleep past any time limit once the engine is built;
# hang-beside-others: the same, except when the case runs alone (a case slowed by its neighbours).
PLANTS = ("flip-token", "abort", "hang", "hang-beside-others")
CROWD_PROGRESS_S = 15.0  # seconds between the crowd's progress lines on stderr
GUIDED_REGEX = "[a-c]{2}-[0-9]{2}"
GUIDED_SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                 "required": ["a"], "additionalProperties": False}


@dataclass
class Work:
    """One request of the workload: added to the crowd engine at step `arrival`."""

    request_id: str
    prompt: list
    arrival: int
    params: object  # SamplingParams


def build_workload(case: dict, vocab: int) -> list[Work]:
    """The case's requests, a pure function of case["workload_seed"] and its sampling and feature fields.

    Prompts share 16- or 32-token prefixes (whole KV blocks, so the prefix cache can hit), mixed
    with unrelated prompts of 1..48 tokens; arrivals are staggered over the first steps; every
    request has its own seed (unseeded requests take a key from their arrival number, which a
    request run alone cannot reproduce)."""
    from rlt_runtime import SamplingParams

    rng = random.Random(case["workload_seed"])
    frng = random.Random(f"{case['workload_seed']}:features")
    hi = vocab - 33  # special tokens sit at the top of the vocabulary
    prefixes = [[rng.randrange(3, hi) for _ in range(rng.choice([16, 32]))] for _ in range(2)]
    preamble = []  # split_keys: one shared preamble of split_keys - 16 tokens, so requests cross a key range
    if case["split_keys"]:
        prng = random.Random(f"{case['workload_seed']}:preamble")
        preamble = [prng.randrange(3, hi) for _ in range(case["split_keys"] - 16)]
    work = []
    for i in range(case["requests"]):
        if rng.random() < 0.6:
            prompt = rng.choice(prefixes) + [rng.randrange(3, hi) for _ in range(rng.randrange(0, 20))]
        else:
            prompt = [rng.randrange(3, hi) for _ in range(rng.randrange(1, 49))]
        greedy = case["sampling"] == "greedy" or (case["sampling"] == "mixed" and rng.random() < 0.5)
        loops = rng.random() < 0.5 and case["loop_bounds"]
        params = SamplingParams(
            n=case["n"], max_tokens=rng.randint(max(4, case["max_tokens"] - 6), case["max_tokens"]),
            temperature=0.0 if greedy else rng.choice([0.7, 1.0]),
            top_p=1.0 if greedy else rng.choice([1.0, 0.9]), top_k=-1 if greedy else rng.choice([-1, 20]),
            seed=rng.randrange(2**31), logprobs=case["logprobs"], ignore_eos=True,
            stop_token_ids=rng.sample(range(3, hi), 3) if rng.random() < 0.3 else None,
            exit_threshold=rng.choice(case["exit_thresholds"]) if case["exit_thresholds"] else 1.0,
            min_loops=2 if loops else None, max_loops=3 if loops else None,
        )
        params = with_features(params, case, frng, hi)
        if params.thinking_token_budget is not None:
            prompt = prompt + think_markers(case["model"])[0]
        work.append(Work(f"r{i}", preamble + prompt, rng.randrange(0, 6), params))
    return work


def with_features(params, case: dict, rng: random.Random, hi: int):
    """`params` with each of the case's features taken with probability 1/2 (drawn from `rng`, a
    stream of its own so a case's base workload does not depend on its features). Guided rows stop
    at the grammar's end (EOS allowed, no stop ids) and take no logit_bias/min_tokens/bad_words or
    allowed_token_ids (a banned token the grammar needs would leave nothing to sample)."""
    from dataclasses import asdict

    from rlt_runtime import SamplingParams

    feats = [f for f in case["features"] if rng.random() < 0.5]
    if not feats:
        return params
    fields = {k: v for k, v in asdict(params).items() if k not in ("stop_list", "_stop_automaton")}
    guided = "guided" in feats
    if guided:
        fields.update(guided={"regex": GUIDED_REGEX} if rng.random() < 0.5 else {"json": GUIDED_SCHEMA},
                      ignore_eos=False, stop_token_ids=None, max_tokens=max(16, params.max_tokens))
    if "penalties" in feats:
        fields.update(repetition_penalty=rng.choice([1.3, 0.7, 2.0]), presence_penalty=rng.choice([0.0, 0.5, -1.0]),
                      frequency_penalty=rng.choice([0.0, 0.4, -0.5, 1.0]))
    if "bias-min-bad" in feats and not guided:
        # A strongly favoured token that is also a stop id: min_tokens holds it back, then it ends
        # the request; a bad word bans it twice in a row, another bans a second favoured token.
        fav, banned, other = rng.sample(range(3, hi), 3)
        fields.update(logit_bias={fav: rng.choice([4.0, 8.0]), banned: -50.0, other: 6.0},
                      bad_words=[[fav, fav], [other]], min_tokens=rng.randint(1, params.max_tokens - 1),
                      stop_token_ids=sorted({*(params.stop_token_ids or ()), fav}))
    if "prompt-logprobs" in feats:
        fields["prompt_logprobs"] = rng.choice([0, 2])
    if "best-of" in feats:
        fields["best_of"] = params.n + rng.choice([1, 2])
    if "allowed-ids" in feats and not guided:
        fields["allowed_token_ids"] = sorted(rng.sample(range(3, hi), 16))
    if "thinking-budget" in feats:
        fields["thinking_token_budget"] = rng.choice([0, 1, 3])
    return SamplingParams(**fields)


def engine_options(case: dict, device: str) -> dict:
    """Options of the engine under test (the crowd), in the engine's own names."""
    opts = dict(
        dtype=case["dtype"], device=device, seed=0, max_model_len=case["max_model_len"], kv_layout=case["kv_layout"],
        last_exited_reads=case["last_exited_reads"], exit_mode=case["exit_mode"],
        exit_criterion_threshold=case["exit_criterion_threshold"], lookahead_seed=case["lookahead_seed"],
        enable_prefix_caching=case["prefix_caching"], preemption_mode=case["preemption_mode"],
        prefill_chunk_size=case["prefill_chunk_size"], max_num_batched_tokens=case["max_num_batched_tokens"],
        max_num_seqs=case["max_num_seqs"], execution_mode=case["execution_mode"],
        async_scheduling=case["async_scheduling"], speculative_config=case["speculative_config"],
        quantization=case["quantization"], kv_cache_dtype=case["kv_cache_dtype"], enable_sleep_mode=case["sleep"],
    )
    if case["execution_mode"] != "eager":
        opts["cuda_graph_sizes"] = case["cuda_graph_sizes"]
    if device == "cuda":
        opts["gpu_memory_utilization"] = case["gpu_memory_utilization"]
    return opts


def alone_options(case: dict, device: str, speculative: bool, num_blocks: int, samples: int) -> dict:
    """The reference engine: same model, dtype, FP8 storage, layout and exit rule; eager,
    synchronous, default chunking and LAST_EXITED reads (both read modes must give the same bits),
    no prefix cache, an ample pool, room for `samples` rows of one request; speculation only for
    sampled speculative requests."""
    return dict(
        dtype=case["dtype"], device=device, seed=0, max_model_len=case["max_model_len"], kv_layout=case["kv_layout"],
        exit_mode=case["exit_mode"], exit_criterion_threshold=case["exit_criterion_threshold"],
        lookahead_seed=case["lookahead_seed"], enable_prefix_caching=False, execution_mode="eager",
        async_scheduling=False, max_num_seqs=max(2, samples), num_blocks=num_blocks,
        speculative_config=case["speculative_config"] if speculative else None,
        quantization=case["quantization"], kv_cache_dtype=case["kv_cache_dtype"],
    )


def lifetime_blocks(case: dict, work: list[Work], block_size: int = 16) -> int:
    """KV blocks the largest request holds at its end (every plane), from the layout the engine builds."""
    from rlt_runtime.cache.layout import make_layout
    from rlt_runtime.models.presets import preset_config

    planes = make_layout(preset_config(case["model"]), case["kv_layout"], preset_config(case["model"]).num_loops).num_planes
    return max(-(-(len(w.prompt) + w.params.max_tokens) // block_size) for w in work) * planes


def _logprobs(entries) -> list:
    """TokenLogprob entries (None allowed) as exact hex strings (bitwise comparison)."""
    return [None if lp is None else [lp.logprob.hex(), [[t, v.hex()] for t, v in lp.top.items()]] for lp in entries]


def _samples(out) -> list[dict]:
    """A finished RequestOutput's samples as plain data, each carrying the request's prompt
    log-probabilities (None unless asked for)."""
    prompt = None if out.prompt_logprobs is None else _logprobs(out.prompt_logprobs)
    return [{"token_ids": list(c.token_ids), "exit_depths": list(c.exit_depths), "finish_reason": c.finish_reason,
             "logprobs": None if c.logprobs is None else _logprobs(c.logprobs), "text": c.text,
             "prompt_logprobs": prompt} for c in sorted(out.outputs, key=lambda c: c.index)]


def row_keys(engine, request_id: str) -> list[int]:
    """The engine's Philox row keys of a just-added request's samples (Huginn's initial state
    depends on them). Read from the engine itself so the reference follows its key derivation."""
    return [r.row_key for r in engine._groups[request_id]]


_STARTED = time.monotonic()


def _progress(what: str) -> None:
    """One line on stderr per phase of the case, seconds since the process started: a case killed
    at its time limit shows in its stderr tail where the time went."""
    print(f"[{time.monotonic() - _STARTED:7.1f} s] {what}", file=sys.stderr, flush=True)


def run_crowd(llm, work: list[Work]) -> tuple[dict, dict]:
    """Add each request at its arrival step and step to the end, checking the block and slot
    invariants after every step and a full pool at the end. Returns ({request_id: [sample dicts]},
    {request_id: row keys})."""
    eng = llm.engine
    pending = sorted(work, key=lambda w: w.arrival)
    done, keys, step = {}, {}, 0
    shown = time.monotonic()
    while pending or eng.has_unfinished_requests():
        if time.monotonic() - shown > CROWD_PROGRESS_S:  # a slow crowd shows what it is doing
            shown = time.monotonic()
            _progress(f"crowd at step {step}, {len(done)} of {len(work)} requests done, {captures(llm.stats())}")
        while pending and pending[0].arrival <= step:
            w = pending.pop(0)
            eng.add_request(w.request_id, w.prompt, w.params)
            keys[w.request_id] = row_keys(eng, w.request_id)
        for out in eng.step():
            if out.finished:
                done[out.request_id] = _samples(out)
        eng.check_invariants()
        step += 1
    free, total = eng.kv.pool.num_free, eng.kv.pool.num_blocks
    assert free == total, f"KV pool not full after the run: {free} of {total} blocks free"
    return done, keys


class DraftTape:
    """The greedy rounds' draft counts of the crowd (`greedy_rounds.GreedyRounds`, the one choice of
    a run that follows measured timings): each round as [count, lowest, highest allowed]. With
    ``replay`` (an earlier run's tape) round i takes replay[i]'s count instead, so a crowd that failed
    beside other cases can run alone with its composition of rounds; a replay that runs out, or
    whose count the round does not allow, stops the crowd (AssertionError)."""

    def __init__(self, greedy, replay=None):
        self.rounds: list = []
        chosen = greedy.drafts

        def drafts(expected, fixed_tokens, fixed_k, rows, exploring=()):
            k = chosen(expected, fixed_tokens, fixed_k, rows, exploring)
            lo, hi = fixed_k, max(fixed_k, max((len(e) - 1 for e in expected), default=0))
            if replay is not None:
                i = len(self.rounds)
                assert i < len(replay), f"the replayed draft counts ran out at round {i}"
                k = replay[i][0]
                assert lo <= k <= hi, f"replayed round {i} takes {k} drafts, allowed {lo}..{hi}"
            self.rounds.append([k, lo, hi])
            return k

        greedy.drafts = drafts


class CommitTrace:
    """What computed each committed token: {(request id, sample index): one line per token}, naming
    the engine step that committed it, the row's kind and draft count, and the step's decode rows
    and prefill chunks (what decides the step's kernel launches). A failure shows the lines of its
    first differing token, crowd and alone."""

    def __init__(self, engine):
        self.tokens: dict = defaultdict(list)
        self.steps = 0
        step: dict = {}
        process, append = engine._process, engine._append

        def traced_process(handle, touched):
            decode = sum(1 for row in handle.rows if row[2] == "decode")
            live = handle.live  # the step's requests, indexed by its row keys
            step.update(number=self.steps, rows={id(live[key]): (kind, k) for key, _, kind, k in handle.rows},
                        shape=f"{decode} decode rows, {len(handle.prefills)} prefill chunks")
            self.steps += 1
            try:
                return process(handle, touched)
            finally:
                step.clear()

        def traced_append(req, *args):
            kind, k = step.get("rows", {}).get(id(req), ("?", 0))
            what = f"{kind} round of {k} drafts" if k else kind
            self.tokens[(req.group_id, req.sample_index)].append(f"step {step.get('number')}, {what} "
                                                                 f"({step.get('shape')})")
            return append(req, *args)

        engine._process, engine._append = traced_process, traced_append

    def line(self, request_id: str, sample: int, index: int) -> str:
        lines = self.tokens.get((request_id, sample), [])
        return lines[index] if index < len(lines) else "not committed"


def run_alone(llm, w: Work, trace: CommitTrace | None = None) -> list[dict]:
    """One request alone in the reference engine (nothing else in flight); with `trace` (of that
    engine) its commits are recorded under the work's request id."""
    outs = llm.generate([{"prompt_token_ids": w.prompt}], w.params, use_tqdm=False)
    if trace is not None:
        for rid, sample in list(trace.tokens):
            if rid == outs[0].request_id:
                trace.tokens[(w.request_id, sample)] = trace.tokens.pop((rid, sample))
    return _samples(outs[0])


def first_difference(got: list[dict], want: list[dict], where=None) -> str:
    """'' when equal, else where the first difference is (sample, field, index, values); with
    `where` (sample, index -> str), what computed a differing output token is appended."""
    if len(got) != len(want):
        return f"{len(got)} samples, expected {len(want)}"
    for s, (g, e) in enumerate(zip(got, want)):
        for name in ("token_ids", "exit_depths", "logprobs", "finish_reason", "prompt_logprobs", "text"):
            a, b = g[name], e[name]
            if a == b:
                continue
            if isinstance(a, list) and isinstance(b, list):
                i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                x = a[i] if i < len(a) else "<end>"
                y = b[i] if i < len(b) else "<end>"
                computed = f" [{where(s, i)}]" if where is not None and name in OUTPUT_TOKEN_FIELDS else ""
                return f"sample {s} {name}[{i}]: got {x} expected {y} (lengths {len(a)}/{len(b)}){computed}"
            return f"sample {s} {name}: got {a} expected {b}"
    return ""


OUTPUT_TOKEN_FIELDS = ("token_ids", "exit_depths", "logprobs")  # one entry per committed output token


def reference_difference(case: dict, w: Work, keys: list[int], got: list[dict]) -> str:
    """Compare an fp32 greedy request's samples with the fp64 dense reference ('' when equal).
    A token mismatch reports the reference's top-2 logit gap there (a near tie is worth knowing)."""
    import torch

    from rlt_runtime.models.exit_rules import lookahead_head
    from rlt_runtime.models.dense_reference import RefExit, reference_generate, reference_logit_processing
    from rlt_runtime.models.huginn import request_initial_state
    from rlt_runtime.models.presets import preset_config
    from rlt_runtime.stable_hash import prompt_key

    cfg, weights = _fp64_weights(case["model"], NEW_WEIGHTS_SEED if case["new_weights"] else 0)
    p = w.params
    common = dict(min_loops=p.min_loops or 1, max_loops=p.max_loops)
    if cfg.family == "ouro":
        mode = case["exit_mode"] if p.exit_threshold < 1.0 else "fixed"
        lw = lb = None
        if mode == "random_lookahead":
            lw = lookahead_head(cfg.hidden_size, case["lookahead_seed"], "cpu", torch.float64)[0]
            lb = torch.zeros((), dtype=torch.float64)
        rule = RefExit(mode=mode, threshold=p.exit_threshold, lookahead_weight=lw, lookahead_bias=lb, **common)
        layout = case["kv_layout"]
    else:
        rule = RefExit(mode=case["exit_mode"], threshold=case["exit_criterion_threshold"], **common)
        core = preset_config(case["model"]).n_layers_in_recurrent_block
        layout = {"last_exited": "full", "shared": f"compress-s{core}"}.get(case["kv_layout"], case["kv_layout"])
    process = None
    if p.processes_logits:  # ignore_eos rows: min_tokens holds back the stop ids alone
        stops = sorted(set(p.stop_token_ids or ())) if p.min_tokens else ()
        process = lambda logits, out: reference_logit_processing(  # noqa: E731
            logits, w.prompt, out, p, stops, [list(b) for b in p.bad_words or ()])
    # best_of returns its n best samples whatever their rows: greedy samples of one request are
    # all equal (Huginn's start from per-row states, so its best_of rows are left to the alone check).
    for s, key in enumerate(keys[:len(got)]):
        init = None
        if cfg.family == "huginn":
            init = request_initial_state(cfg, len(w.prompt), prompt_key(engine_options(case, "cpu")["seed"]), key)
        ref = reference_generate(cfg, weights, w.prompt, p.max_tokens, exit=rule, kv_layout=layout,
                                 stop_token_ids=p.stop_token_ids or (), initial_state=init, process_logits=process)
        mine = got[s]
        if mine["token_ids"] != ref.tokens:
            i = next((i for i, (x, y) in enumerate(zip(mine["token_ids"], ref.tokens)) if x != y),
                     min(len(mine["token_ids"]), len(ref.tokens)))
            gap = ""
            if i < len(ref.logits):
                top = ref.logits[i].topk(2).values
                gap = f"; fp64 top-2 logit gap there {float(top[0] - top[1]):.3g}"
            return f"sample {s} token_ids vs fp64 reference differ at {i}: got {mine['token_ids']} expected {ref.tokens}{gap}"
        if mine["exit_depths"] != ref.exit_depths:
            return f"sample {s} exit_depths vs fp64 reference: got {mine['exit_depths']} expected {ref.exit_depths}"
    return ""


def feature_counts(work: list[Work]) -> dict:
    """How many requests took each feature (what the log shows a case exercised)."""
    has = {"penalties": lambda p: p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty,
           "bias-min-bad": lambda p: p.logit_bias is not None, "prompt-logprobs": lambda p: p.prompt_logprobs is not None,
           "best-of": lambda p: p.num_samples > p.n, "guided": lambda p: p.guided is not None,
           "allowed-ids": lambda p: p.allowed_token_ids is not None,
           "thinking-budget": lambda p: p.thinking_token_budget is not None}
    counts = {name: sum(bool(test(w.params)) for w in work) for name, test in has.items()}
    return {name: n for name, n in counts.items() if n}


def think_markers(model: str) -> tuple[list[int], list[int]]:
    """The token ids of `<think>` and `</think>` in the preset's built-in tokenizer (the engine's)."""
    from rlt_runtime.engine.thinking_budget import THINK_END, THINK_START
    from rlt_runtime.models.presets import preset_config
    from rlt_runtime.models.tokenizer import builtin_tokenizer

    tok = builtin_tokenizer(preset_config(model))
    return tok.encode(THINK_START, add_special_tokens=False), tok.encode(THINK_END, add_special_tokens=False)


def budget_problem(budget: int, end: list[int], sample: dict) -> str:
    """'' when a sample of a prompt ending in `<think>` closes its reasoning in time: the end marker
    `end` (or as much of it as the output holds) starts at an output position <= `budget`."""
    out = sample["token_ids"]
    for j in range(min(budget, len(out)) + 1):
        piece = out[j:j + len(end)]
        if piece == end[:len(piece)] and (piece or j == len(out)):
            return ""
    return f"no </think> starts by output position {budget}: {out}"


def guided_problem(guided, sample: dict) -> str:
    """'' when a guided sample ended with its grammar and its text matches it (the regex in full,
    or JSON of GUIDED_SCHEMA), else what is wrong."""
    import re

    text = sample["text"]
    if sample["finish_reason"] != "stop":
        return f"finish_reason {sample['finish_reason']!r} (the grammar never ended), text {text!r}"
    if guided.regex is not None:
        return "" if re.fullmatch(guided.regex, text) else f"text {text!r} does not match {guided.regex!r}"
    try:
        obj = json.loads(text)
    except ValueError:
        return f"text {text!r} is not JSON"
    ok = isinstance(obj, dict) and set(obj) == {"a"} and type(obj["a"]) is int and 0 <= obj["a"] <= 9
    return "" if ok else f"JSON {obj!r} does not follow the schema"


_WEIGHTS: dict = {}
NEW_WEIGHTS_SEED = 1  # the weights a case with new_weights switches to


def _fp64_weights(preset: str, seed: int = 0):
    import torch

    from rlt_runtime.models.presets import preset_config, preset_weights

    if (preset, seed) not in _WEIGHTS:
        cfg = preset_config(preset)
        _WEIGHTS[preset, seed] = cfg, dict(preset_weights(cfg, seed=seed, dtype=torch.float64))
    return _WEIGHTS[preset, seed]


def take_new_weights(llm, case: dict, warm_up=None) -> None:
    """With case["new_weights"]: run `warm_up` (a Work, max 2 tokens: graphs get captured, its
    prefix cached), then give the engine the preset's weights of NEW_WEIGHTS_SEED (update_weights,
    every other tensor in one call, the rest in a second)."""
    if not case["new_weights"]:
        return
    import torch

    from rlt_runtime import SamplingParams
    from rlt_runtime.models.presets import preset_config, preset_weights

    if warm_up is not None:
        llm.generate([warm_up.prompt], SamplingParams(max_tokens=2, temperature=0.0, seed=1), use_tqdm=False)
    cfg = preset_config(case["model"])
    weights = list(preset_weights(cfg, seed=NEW_WEIGHTS_SEED, dtype=torch.float32))
    asleep = case["sleep"] and warm_up is not None  # (the crowd: the reference engine stays awake)
    if asleep:
        llm.sleep(level=2)  # as beside a trainer: the weights discarded, then refilled
        llm.wake_up(tags=["weights"])
    llm.update_weights(weights[::2])  # in two parts, as trainers that gather module by module send them
    llm.update_weights(weights[1::2])
    if asleep:
        llm.wake_up(tags=["kv_cache"])


def _graph_sets(stats: dict) -> dict:
    """The engine's graph sets' stats by name (None where the mode has none)."""
    return {"graphs": stats.get("graphs"), "prefill_graphs": stats.get("prefill_graphs"),
            "speculative graphs": (stats.get("speculative") or {}).get("graphs")}


def capture_failures(stats: dict) -> str:
    """'' when every graph bucket captured; else which graph set had failures."""
    bad = [f"{name}: {st['failed_captures']} failed captures" for name, st in _graph_sets(stats).items()
           if st and st["failed_captures"]]
    return "; ".join(bad)


def captures(stats: dict) -> str:
    """How many graphs the engine captured and in how many seconds."""
    sets = [st for st in _graph_sets(stats).values() if st]
    return f"{sum(st['captures'] for st in sets)} graph captures in {sum(st['capture_seconds'] for st in sets):.1f} s"


def _release_memory() -> None:
    """Return a dropped engine's device memory before the reference engines are built."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_case(case: dict) -> dict:
    """Run one case in this process; returns the result dict (see module docstring)."""
    import torch

    from rlt_runtime import LLM, ConfigError
    from rlt_runtime.models.presets import preset_config

    device = case["device"]
    if device == "cpu":
        torch.set_num_threads(1)
    if "guided" in case.get("features", ()) and importlib.util.find_spec("xgrammar") is None:
        return {"status": "config-error", "detail": "guided decoding needs the xgrammar package (not installed here)",
                "checks": [], "stats": {}}
    if case["split_keys"]:  # every engine of this process splits attention keys into ranges this long
        import rlt_kernels.attention as attention

        attention.DEFAULT_SPLIT_SIZE = case["split_keys"]
    vocab = preset_config(case["model"]).vocab_size
    work = build_workload(case, vocab)
    opts = engine_options(case, device)
    try:
        need = lifetime_blocks(case, work)
        if case["tiny_pool"]:
            opts["num_blocks"] = need + case["tiny_pool"]
        llm = LLM(case["model"], **opts)
    except ConfigError as exc:
        return {"status": "config-error", "detail": str(exc), "checks": [], "stats": {}}
    greedy_rounds = llm.engine.scheduler.greedy_rounds
    tape = DraftTape(greedy_rounds, case.get("replay_drafts")) if greedy_rounds is not None else None
    taped = {"round_drafts": tape.rounds} if tape is not None else {}
    take_new_weights(llm, case, work[0])
    crowd_trace = CommitTrace(llm.engine)
    _progress(f"engine built, {captures(llm.stats())}")
    if case.get("plant") == "hang" or (case.get("plant") == "hang-beside-others" and not case.get("alone")):
        time.sleep(3600)
    checks = []
    try:
        got, keys = run_crowd(llm, work)
    except AssertionError as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"status": "fail", "detail": f"crowd run: {exc!r} at {Path(where.filename).name}:{where.lineno}",
                "checks": checks, "stats": _stats(llm.stats()), **taped}
    stats = _stats(llm.stats())
    _progress(f"crowd done, {stats['steps']} steps, {captures(llm.stats())} in all")
    problems = []
    bad = capture_failures(llm.stats())
    if bad:
        problems.append(bad)
    spec = case["speculative_config"]
    drafting = [w for w in work if w.params.speculative]
    if spec and spec["draft_policy"] == "fixed" and drafting and not stats["spec_rounds"]:
        problems.append("fixed-K speculation ran no round")
    checks.append("invariants every step, pool full at the end, no failed capture")
    del llm
    _release_memory()
    if case.get("plant") == "flip-token":
        got["r0"][0]["token_ids"][-1] ^= 1
    sampled_spec = {w.request_id for w in work if spec and not w.params.greedy}
    samples = max(w.params.num_samples for w in work)
    ample = need * (samples + 1)
    refs = {False: LLM(case["model"], **alone_options(case, device, False, ample, samples))}
    if sampled_spec:
        refs[True] = LLM(case["model"], **alone_options(case, device, True, ample, samples))
    for ref in refs.values():
        take_new_weights(ref, case)
    alone_traces = {speculative: CommitTrace(ref.engine) for speculative, ref in refs.items()}
    # One reference engine serves the requests one at a time, in the reverse of the crowd's admission
    # order: a request's result must depend neither on its arrival number nor on earlier requests.
    _progress(f"{len(refs)} alone engine(s) built")
    for w in reversed(sorted(work, key=lambda w: w.arrival)):
        alone_trace = alone_traces[w.request_id in sampled_spec]
        alone = run_alone(refs[w.request_id in sampled_spec], w, alone_trace)
        diff = first_difference(got[w.request_id], alone, lambda s, i, w=w, t=alone_trace: (
            f"crowd: {crowd_trace.line(w.request_id, s, i)}; alone: {t.line(w.request_id, s, i)}"))
        _progress(f"{w.request_id} alone done")
        if diff:
            kind = "alone (eager, sync, same speculation)" if w.request_id in sampled_spec else "alone (eager, sync)"
            problems.append(f"{w.request_id} vs {kind}: {diff}")
    checks.append(f"{len(work) - len(sampled_spec)} requests vs alone eager, {len(sampled_spec)} vs alone speculative")
    if case["split_keys"]:
        crossing = sum(len(w.prompt) + w.params.max_tokens > case["split_keys"] for w in work)
        checks.append(f"{crossing} requests reach past one {case['split_keys']}-key attention range")
    drawn = feature_counts(work)
    if drawn:
        checks.append("requests with features: " + ", ".join(f"{k} {v}" for k, v in drawn.items()))
    guided = [w for w in work if w.params.guided is not None]
    for w in guided:
        for i, sample in enumerate(got[w.request_id]):
            bad = guided_problem(w.params.guided, sample)
            if bad:
                problems.append(f"{w.request_id} sample {i} (guided): {bad}")
    if guided:
        checks.append(f"{len(guided)} guided requests end with their grammar and match it")
    budgeted = [w for w in work if w.params.thinking_token_budget is not None and w.params.guided is None]
    end = think_markers(case["model"])[1] if budgeted else None
    for w in budgeted:
        for i, sample in enumerate(got[w.request_id]):
            bad = budget_problem(w.params.thinking_token_budget, end, sample)
            if bad:
                problems.append(f"{w.request_id} sample {i} (thinking budget): {bad}")
    if budgeted:
        checks.append(f"{len(budgeted)} budgeted requests close their reasoning by the budget")
    if case["dtype"] == "float32" and case["quantization"] is None and case["kv_cache_dtype"] == "auto":
        greedy = [w for w in work if w.params.greedy and w.params.guided is None and w.params.thinking_token_budget is None
                  and not (w.params.num_samples > w.params.n and preset_config(case["model"]).family == "huginn")]
        for w in greedy:
            diff = reference_difference(case, w, keys[w.request_id], got[w.request_id])
            if diff:
                problems.append(f"{w.request_id}: {diff}")
        checks.append(f"{len(greedy)} greedy requests vs the fp64 dense reference")
    detail = problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "") if problems else ""
    return {"status": "fail" if problems else "pass", "detail": detail, "problems": problems, "checks": checks,
            "stats": stats, **taped}


def _stats(st: dict) -> dict:
    spec = st.get("speculative") or {}
    return {"steps": st["steps"], "preemptions": st["preemptions"], "prefix_cache_hits": st["prefix_cache_hits"],
            "kv_blocks": st["kv_blocks"], "spec_rounds": spec.get("rounds", 0), "spec_accepted": spec.get("accepted", 0)}


def main(argv: list[str]) -> int:
    case_path, result_path = argv
    with open(case_path, encoding="utf-8") as f:
        case = json.load(f)
    if case.get("plant") not in (None, *PLANTS):
        raise ValueError(f"plant must be None or one of {PLANTS}, got {case['plant']!r}")
    if case.get("plant") == "abort":
        os.abort()
    start = time.monotonic()
    result = run_case(case)
    result["duration_s"] = round(time.monotonic() - start, 2)
    with open(result_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
