"""LLMEngine: requests in, RequestOutputs out, one `step()` at a time.

It owns the scheduler (plain Python), the KV block accounting and the model runner. A step is
schedule → submit device work → process results. With async scheduling the results of step N
are processed after step N+1 has been submitted: sampled tokens stay on the device and feed the
next step, and the host learns them one step late.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import time
from typing import Optional, Union

import torch

from rlt_kernels.fp8 import FP8_DTYPE

from ..cache.kv_cache import KVCacheManager
from ..cache.layout import make_layout
from ..cache.memory import check_context_fits
from ..config import HUGINN_CRITERION_DEFAULTS, EngineConfig
from ..errors import ConfigError, RequestError
from ..executor.executor import build_executor
from ..executor.model_runner import StepHandle
from ..executor.sleep import check_tags
from ..executor.token_mask import allowed_words, new_bitmask, restrict
from ..executor.ops import check_flash_setup
from ..executor.worker import WorkerSpec
from ..models import load_model
from ..models.configs import hf_weight_shapes
from ..models.generation_defaults import generation_defaults
from ..outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprob
from ..sampling_params import SamplingParams
from ..stable_hash import prompt_key, sample_key, stable_hash, unseeded_key
from .exit_trace import load_trace
from .request import Request
from .scheduler import Scheduler
from .step_builder import StepBuilder
from .text import TextTracker
from .thinking_budget import THINK_END, THINK_START, ThinkingBudget

logger = logging.getLogger("rlt")

def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} but CUDA is not available; use 'cpu' or 'auto'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device={name!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = getattr(torch, name)
    if dtype == torch.float64 and device.type == "cuda":
        raise ConfigError("dtype='float64' is only supported on CPU (it is the test oracle precision)")
    return dtype


def _on_device(method):
    """Run an engine method with the engine's CUDA device current (streams, events, graphs)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.device.type != "cuda":
            return method(self, *args, **kwargs)
        with torch.cuda.device(self.device):
            return method(self, *args, **kwargs)

    return wrapper


def eos_token_ids(tokenizer, model_config) -> tuple[int, ...]:
    """The end-of-sequence ids: the tokenizer's, else the checkpoint config's."""
    return tuple(tokenizer.eos_token_ids if tokenizer is not None else model_config.eos_token_ids)


def tokenize_prompt(prompt, tokenizer) -> tuple[Optional[str], list[int]]:
    """(text or None, token ids) of an engine prompt: a string (encoded by `tokenizer`), a token-id
    list, {"prompt_token_ids": [...], "prompt": optional text} (vLLM's TokensPrompt) or {"prompt":
    text} (vLLM's TextPrompt, encoded). RequestError for anything else."""
    if isinstance(prompt, dict):
        unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids"})
        if unknown or not prompt:
            raise RequestError(f"a dict prompt has 'prompt_token_ids' (and optionally its 'prompt' text) or "
                               f"'prompt' alone; got the keys {sorted(prompt)}")
        if "prompt_token_ids" not in prompt:
            return tokenize_prompt(prompt["prompt"], tokenizer)
        ids = prompt["prompt_token_ids"]
        if not isinstance(ids, (list, tuple)):
            raise RequestError("prompt_token_ids must be a list of integers")
        return prompt.get("prompt"), list(ids)
    if isinstance(prompt, (list, tuple)):
        return None, list(prompt)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestError("this checkpoint has no tokenizer: give prompts as token ids")
        if not prompt:
            raise RequestError("prompt must not be empty")
        return prompt, tokenizer.encode(prompt)
    raise RequestError(f"prompt must be a string, a token-id list or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}")


class LLMEngine:
    """The engine behind `LLM`, the CLI and the server."""

    def __init__(self, model: str, cfg: Optional[EngineConfig] = None, **kwargs):
        cfg = cfg or EngineConfig.from_kwargs(**kwargs)
        cfg.validate_static()
        if cfg.data_parallel_size != 1:
            raise ConfigError(f"LLMEngine runs one replica but data_parallel_size={cfg.data_parallel_size}; build the "
                              "engine with rlt_runtime.engine.data_parallel.build_engine (LLM and rlt-serve do)")
        if cfg.disaggregated_prefill:
            raise ConfigError("LLMEngine runs one engine but disaggregated_prefill=True; build the engine with "
                              "rlt_runtime.engine.data_parallel.build_engine (LLM and rlt-serve do)")
        self.cfg = cfg
        self.device = _resolve_device(cfg.device)
        self._init(model, cfg)

    @_on_device
    def _init(self, model: str, cfg: EngineConfig) -> None:
        self.dtype = _resolve_dtype(cfg.dtype, self.device)
        self.kv_dtype = FP8_DTYPE if cfg.kv_cache_dtype == "fp8" else self.dtype
        self.model_name = model
        self.model_config, weights, self.tokenizer = load_model(model, seed=cfg.seed, device=self.device, dtype=self.dtype,
                                                               tokenizer=cfg.tokenizer, revision=cfg.revision,
                                                               download_dir=cfg.download_dir)
        mc = self.model_config
        self.generation_defaults = generation_defaults(model, cfg)  # sampling defaults of requests that omit them
        self._eos = eos_token_ids(self.tokenizer, mc)
        self.family = mc.family
        depth = cfg.num_loops or mc.num_loops
        if depth > mc.max_supported_loops:
            raise ConfigError(f"num_loops must be in 1..{mc.max_supported_loops} for {mc.family}, got {depth}")
        cfg.validate_for_model(mc.family, depth)
        self.depth = depth
        self.exit_mode = cfg.exit_mode or ("ouro" if mc.family == "ouro" else "fixed")
        self.trace = load_trace(cfg.exit_trace) if self.exit_mode == "trace" else None
        criterion = cfg.exit_criterion_threshold
        if criterion is None:
            criterion = HUGINN_CRITERION_DEFAULTS.get(self.exit_mode)
        reads = cfg.last_exited_reads or ("copy" if cfg.attention_backend == "flash" and self.layout_has_planes(mc, cfg, depth)
                                          else "indirect")
        self.layout = make_layout(mc, cfg.kv_layout, depth, copy_reads=reads == "copy")
        if cfg.max_model_len is not None and cfg.max_model_len > mc.max_model_len:
            raise ConfigError(f"max_model_len ({cfg.max_model_len}) exceeds the model's context ({mc.max_model_len})")
        self.max_model_len = cfg.max_model_len or mc.max_model_len
        on_cuda = self.device.type == "cuda"
        self.max_num_seqs = cfg.max_num_seqs or (256 if on_cuda else 16)
        self.max_num_batched_tokens = cfg.max_num_batched_tokens or max(self.max_num_seqs, 4096 if on_cuda else 512)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs})"
            )
        cfg.max_num_seqs, cfg.max_num_batched_tokens = self.max_num_seqs, self.max_num_batched_tokens
        cfg.prefill_chunk_size = cfg.prefill_chunk_size or self.max_num_batched_tokens
        origin = ("the max_model_len option" if cfg.max_model_len is not None
                  else f"the model's context: field {mc.context_field!r} of its config")
        weights_estimate = sum(math.prod(shape) for shape in hf_weight_shapes(mc).values()) * self.dtype.itemsize
        weights_estimate //= cfg.tensor_parallel_size  # about what each rank's device holds
        check_context_fits(self.max_model_len, origin=origin, head_dim=mc.head_dim, num_planes=self.layout.num_planes,
                           num_slots=self.max_num_seqs, block_size=cfg.block_size, weights_bytes=weights_estimate,
                           device=self.device)
        self.async_scheduling = on_cuda if cfg.async_scheduling is None else cfg.async_scheduling
        if cfg.attention_backend == "flash":
            check_flash_setup(self.layout, self.device, self.dtype, cfg.block_size)
        self.execution_mode = cfg.execution_mode or ("graphs" if on_cuda else "eager")
        if self.execution_mode != "eager" and not on_cuda:
            raise ConfigError(f"execution_mode={self.execution_mode!r} needs a CUDA device; use 'eager' on CPU")
        spec = WorkerSpec(
            model=model, model_config=mc, layout=self.layout, seed=cfg.seed, tokenizer=cfg.tokenizer,
            revision=cfg.revision, download_dir=cfg.download_dir, device=str(self.device), dtype=self.dtype,
            kv_dtype=self.kv_dtype, quantization=cfg.quantization, attention_backend=cfg.attention_backend,
            batch_invariant=cfg.batch_invariant, execution_mode=self.execution_mode, num_slots=self.max_num_seqs,
            block_size=cfg.block_size, max_model_len=self.max_model_len, max_tokens=self.max_num_batched_tokens,
            exit_mode=self.exit_mode, criterion_threshold=criterion, lookahead_seed=cfg.lookahead_seed,
            prompt_key=prompt_key(cfg.seed), penalties=cfg.enable_penalties,
        )
        self.executor = build_executor(spec, cfg, weights)
        blocks_per_seq = -(-self.max_model_len // cfg.block_size)
        useful = blocks_per_seq * self.layout.num_planes * self.max_num_seqs
        self.memory_plan = self.executor.plan_memory(cfg, useful)
        self.executor.allocate_kv(self.memory_plan.num_blocks)
        logger.info(self.memory_plan.describe())
        self.kv = KVCacheManager(self.memory_plan.num_blocks, cfg.block_size, self.layout.num_planes,
                                 enable_prefix_caching=cfg.enable_prefix_caching,
                                 cache_salt=stable_hash("rlt.cache", model, depth, cfg.kv_layout, cfg.seed))
        self.scheduler = Scheduler(cfg, self.kv, depth=depth, shares_planes=self.layout.shares_planes, num_slots=self.max_num_seqs)
        self._steps = StepBuilder(depth)
        if self.execution_mode != "eager":
            from ..executor.graphs import default_ladder, doubling_ladder

            self.executor.enable_graphs(cfg.cuda_graph_sizes or default_ladder(self.max_num_seqs),
                                        doubling_ladder(self.max_num_batched_tokens, first=16))
        self.policy = None
        self.spec_stats = None
        self._synthetic = cfg.speculative_config is not None and cfg.speculative_config.synthetic_acceptance is not None
        if cfg.speculative_config is not None:
            self._init_speculation(cfg.speculative_config)
        self._groups: dict[str, list[Request]] = {}
        self._asleep: list[str] = []  # sleep mode: what `sleep` gave back and `wake_up` has not taken again
        self._trackers: dict[int, TextTracker] = {}
        self._prompts: dict[str, Optional[str]] = {}
        self._arrivals = itertools.count()
        self._pending: Optional[StepHandle] = None
        self._grammars = None  # GrammarBackend, built with the first guided request
        self._wait_s = 0.0
        self._last_device_ms: Optional[float] = None
        self._recorded_trace: dict[str, list[int]] = {}
        self.num_steps = 0
        self._profiler = None
        self._profile_manual = False  # the recording trace was started by start_profile
        self.timings: Optional[list] = None  # set to [] to record (host_ms, device_ms) per processed step

    @staticmethod
    def layout_has_planes(mc, cfg, depth) -> bool:
        """Whether the layout keeps one plane per loop (where LAST_EXITED reads matter)."""
        return make_layout(mc, cfg.kv_layout, depth).core_planes == depth > 1

    def _init_speculation(self, spec) -> None:
        from .draft_policy import DraftPolicy
        from .greedy_rounds import GreedyRounds

        if self.exit_mode == "trace" and self.async_scheduling:
            raise ConfigError("exit_mode='trace' with speculative decoding needs async_scheduling=False "
                              "(trace depths are indexed by output position, which async rounds learn late)")
        if self.layout.shares_planes:
            raise ConfigError(
                f"speculative_config needs a layout with one plane per loop (kv_layout='last_exited'), got "
                f"kv_layout={self.cfg.kv_layout!r}: where loops share planes, a token's loop 0 reads the previous "
                "token's last loop, so drafts can only be verified one position at a time (no faster than plain decoding)")
        d = spec.draft_loops or (min(2, self.depth - 1) if self.family == "ouro" else max(1, self.depth // 4))
        if not 1 <= d < self.depth:
            raise ConfigError(f"speculative_config.draft_loops must be in 1..{self.depth - 1}, got {d}")
        self.draft_loops = d
        sizes = None
        if self.execution_mode != "eager":
            from ..executor.graphs import doubling_ladder

            sizes = self.cfg.cuda_graph_sizes or doubling_ladder(self.max_num_seqs)
        self.executor.init_speculation(spec.num_speculative_tokens, d, spec.synthetic_acceptance, sizes)
        # At most one round of K drafts must fit the token budget (rows never draft less to fit).
        k_max = min(spec.num_speculative_tokens, self.max_num_batched_tokens - 1)
        self.policy = DraftPolicy(k_max, d, self.depth, adaptive=spec.draft_policy == "adaptive",
                                  disable_by_batch_size=spec.disable_by_batch_size)
        self.scheduler.draft_policy = self.policy
        self.scheduler.greedy_rounds = GreedyRounds(self.policy.cost) if self.policy.adaptive else None
        self.spec_stats = {"rounds": 0, "drafted": 0, "accepted": 0, "committed": 0, "verify_rows": 0,
                           "accepted_per_position": [0] * spec.num_speculative_tokens,
                           "drafted_per_position": [0] * spec.num_speculative_tokens}

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: Union[str, list[int], dict, None], params: Optional[SamplingParams] = None,
                    *, arrival_time: Optional[float] = None, arrival_index: Optional[int] = None) -> None:
        """Validate and queue a request (n samples become n sequences). Errors name the field.

        arrival_index: the request's place in the arrival order (default: this engine's own count);
        it orders FCFS admission and keys the randomness of unseeded samples, so a front end over
        several engines gives it to keep their outputs those of one engine."""
        if self._asleep:
            raise RequestError(f"the engine is asleep ({', '.join(self._asleep)} given back): call wake_up() first")
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise RequestError("sampling_params must be a SamplingParams")
        request_id = str(request_id)
        if request_id in self._groups:
            raise RequestError(f"request_id {request_id!r} is already in use")
        self._check_stop_limits(params.stop_list)
        text, ids = self._tokenize(prompt)
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        kept = params.truncated(ids, self.max_model_len)
        if len(kept) < len(ids):
            ids, text = kept, self.tokenizer.decode(kept) if text is not None and self.tokenizer is not None else None
        if not ids:
            raise RequestError("prompt must not be empty")
        if len(ids) >= self.max_model_len:
            raise RequestError(
                f"prompt has {len(ids)} tokens but the context holds {self.max_model_len} (max_model_len); "
                "the prompt must be shorter than the context"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > vocab:
                raise RequestError(f"{name} must be in 0..{vocab} (the vocabulary size) for this model, got {value}")
        for name in ("min_loops", "max_loops"):
            value = getattr(params, name)
            if value is not None and value > self.depth:
                raise RequestError(f"{name} must be in 1..{self.depth} (the model depth), got {value}")
        if not self.cfg.enable_chunked_prefill and len(ids) > self.max_num_batched_tokens:
            raise RequestError(
                f"prompt has {len(ids)} tokens but chunked prefill is off and max_num_batched_tokens is "
                f"{self.max_num_batched_tokens}"
            )
        max_tokens = min(params.max_tokens or self.max_model_len, self.max_model_len - len(ids))
        lifetime = self.kv.blocks_for(len(ids) + max_tokens - 1) * self.layout.num_planes
        if not self.cfg.enable_preemption:  # admission reserves this (with in-flight drafts) up front
            lifetime = self.scheduler.lifetime_blocks(len(ids), max_tokens, params.speculative)
        if lifetime > self.memory_plan.num_blocks:
            raise RequestError(
                f"request needs {lifetime} KV blocks (prompt {len(ids)} + max_tokens {max_tokens}) but the pool has "
                f"{self.memory_plan.num_blocks}; lower max_tokens or raise the KV cache size"
            )
        trace = None
        if self.trace is not None:
            trace = self._trace_for(request_id, max_tokens, params)
        arrival = next(self._arrivals) if arrival_index is None else arrival_index
        now = time.monotonic() if arrival_time is None else arrival_time
        stops = params.stop_automaton()  # built once, shared by the prompts and samples using params
        grammar = self._compile_guided(params) if params.guided is not None else None
        grammar_stops = list(dict.fromkeys([*self._eos, *(params.stop_token_ids or ())]))  # the grammar ends on these
        group = []
        min_token_stops, bad_word_ids = self._processing_ids(params)
        allowed = None  # a guided request's allowed_token_ids as a mask row, for the host's grammar masks
        if grammar is not None and params.allowed_token_ids is not None:
            allowed = allowed_words(params.allowed_token_ids, self.model_config.vocab_size)
        # Synthetic acceptance commits drafts the grammar never checked: guided rows do not draft there.
        think_markers = self._think_markers() if params.thinking_token_budget is not None else None
        hosted = grammar is not None or think_markers is not None  # a host matcher decides its masks
        drafts = self.policy is not None and params.speculative and (not hosted or not self._synthetic)
        for i in range(params.num_samples):
            key = sample_key(params.seed, i) if params.seed is not None else unseeded_key(self.cfg.seed, arrival, i)
            req = Request(
                request_id=request_id if params.num_samples == 1 else f"{request_id}[{i}]", prompt_token_ids=list(ids),
                params=params, min_token_stops=min_token_stops, bad_word_ids=bad_word_ids,
                arrival_index=arrival, row_key=key, max_tokens=max_tokens,
                depth_limit=min(params.max_loops or self.depth, self.depth), min_loops=params.min_loops or 1,
                group_id=request_id, sample_index=i, prompt=text, trace_depths=trace,
                draft=self.policy.new_state(max_tokens) if drafts else None,
                matcher=self._matcher(grammar, grammar_stops, params.thinking_token_budget, think_markers, ids),
                allowed_words=allowed,
            )
            req.metrics = RequestMetrics(arrival_time=now, num_prompt_tokens=len(ids))
            self._trackers[id(req)] = TextTracker(self.tokenizer, stops, list(ids), params.skip_special_tokens,
                                                  params.include_stop_str_in_output, params.min_tokens)
            group.append(req)
        self._groups[request_id] = group
        self._prompts[request_id] = text
        for req in group:
            self.scheduler.add(req)

    def _matcher(self, grammar, grammar_stops: list[int], budget: Optional[int], think_markers, prompt_ids: list[int]):
        """A new sequence's host matcher: its grammar's, wrapped by its thinking budget; None without either."""
        matcher = self._grammars.matcher(grammar, grammar_stops) if grammar is not None else None
        if budget is not None:
            matcher = ThinkingBudget(budget, *think_markers, prompt_ids, matcher)
        return matcher

    def _think_markers(self) -> tuple[list[int], list[int]]:
        """The token ids of the reasoning's start and end markers (RequestError without a tokenizer)."""
        if self.tokenizer is None:
            raise RequestError("thinking_token_budget: this checkpoint has no tokenizer, which the reasoning markers "
                               "need")
        return [self.tokenizer.encode(m, add_special_tokens=False) for m in (THINK_START, THINK_END)]

    def _compile_guided(self, params: SamplingParams):
        """The compiled grammar of params.guided (RequestError naming its field when it does not compile)."""
        if self.tokenizer is None:
            raise RequestError(f"{params.guided.origin}: this checkpoint has no tokenizer, which guided decoding needs")
        if self._grammars is None:
            from .grammar import GrammarBackend

            try:
                self._grammars = GrammarBackend(self.tokenizer, self.model_config.vocab_size, self._eos)
            except ConfigError as exc:
                raise RequestError(f"{params.guided.origin}: {exc}") from None
        return self._grammars.compile(params.guided)

    def _fill_masks(self, sched, decode_rows: bool = True) -> bool:
        """Write the next-token bitmasks of the step's guided rows (decode rows unless decode_rows
        is False, and prefill chunks that sample) into `sched`, from their matchers' committed
        state. Returns whether any."""
        rows = [r for r in sched.decodes if r.matcher is not None] if decode_rows else []
        rows += [c.request for c in sched.prefills if c.sample and c.request.matcher is not None]
        if not rows:
            return False
        sched.guided_slots, sched.guided_masks = [r.slot for r in rows], self._masks(rows)
        return True

    def _masks(self, rows: list[Request]):
        """int32 [len(rows), ceil(vocab / 32)] CPU bitmasks of the rows' next tokens; a request that
        has finished allows every token (its row's sample is discarded)."""
        masks = new_bitmask(len(rows), self.model_config.vocab_size)
        for i, r in enumerate(rows):
            if not r.finished:
                r.matcher.fill_next_token_bitmask(masks, i)
                restrict(masks[i:i + 1], r.allowed_words)
        return masks

    def _late_masks(self, rows: list[Request], touched: dict) -> tuple:
        """The executor's `late_masks` for guided decode rows: process the pending step (whose
        tokens these masks follow) while the device runs this step's forward, then build them."""
        slots = [r.slot for r in rows]  # as the step has them (a request that finishes now gives its slot up)
        previous, self._pending = self._pending, None
        self._process(previous, touched)
        return slots, self._masks(rows)

    def _check_drafts(self, live: list[Request], drafted: dict[int, list[int]]) -> dict:
        """The bitmasks of guided rows' verify positions, {step key: int32 [k + 1, ceil(vocab / 32)]}
        for drafted = {step key: drafts y_1..y_k} (`Executor.execute`'s guide): row j allows the
        tokens that follow the committed output and drafts y_1..y_j. The matcher takes the drafts
        one by one until the grammar rejects one (or ends); rows after that one allow every token
        (acceptance stops at the rejected draft at the latest). The matcher is rolled back: it
        holds the committed output only."""
        out = {}
        for key, tokens in drafted.items():
            matcher = live[key].matcher
            masks = new_bitmask(len(tokens) + 1, self.model_config.vocab_size)
            matcher.fill_next_token_bitmask(masks, 0)
            taken = 0
            for token in tokens:
                if not matcher.accept_token(token):
                    break
                taken += 1
                if matcher.is_terminated():  # a drafted EOS ends the grammar (and the request, if accepted)
                    break
                matcher.fill_next_token_bitmask(masks, taken)
            matcher.rollback(taken)
            restrict(masks, live[key].allowed_words)
            out[key] = masks
        return out

    def _processing_ids(self, params: SamplingParams) -> tuple[list[int], list[list[int]]]:
        """(ids min_tokens holds back, bad words as token-id lists), checked against the vocabulary
        and the per-slot capacities of logit processing (RequestError naming the field)."""
        from ..executor.logit_processing import MAX_MIN_TOKEN_STOPS
        from ..sampling_params import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS

        if not self.cfg.enable_penalties:
            for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
                if getattr(params, name) != neutral:
                    raise RequestError(f"{name} needs the engine option enable_penalties=True (this engine runs without "
                                       f"the per-slot penalty state); leave {name} at {neutral:g}")
        vocab = self.model_config.vocab_size
        for name, ids in (("logit_bias", params.logit_bias or {}), ("allowed_token_ids", params.allowed_token_ids or ())):
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise RequestError(f"{name} token ids must be in [0, {vocab}) for this model, got {bad[:5]}")
        stops = []
        if params.min_tokens:
            eos = () if params.ignore_eos else self._eos
            stops = sorted({t for t in [*eos, *(params.stop_token_ids or ())] if t < vocab})
            if len(stops) > MAX_MIN_TOKEN_STOPS:
                raise RequestError(f"min_tokens holds back EOS and stop_token_ids: at most {MAX_MIN_TOKEN_STOPS} ids, "
                                   f"got {len(stops)}")
        words: list[list[int]] = []
        for word in params.bad_words or ():
            if isinstance(word, str):
                if self.tokenizer is None:
                    raise RequestError("bad_words: this checkpoint has no tokenizer; give bad words as token-id lists")
                variants = [self.tokenizer.encode(text, add_special_tokens=False)
                            for text in (word.lstrip(), " " + word.lstrip())]
            else:
                variants = [list(word)]
            for ids in variants:
                if ids and ids not in words:
                    words.append(ids)
        for ids in words:
            if len(ids) > MAX_BAD_WORD_TOKENS:
                raise RequestError(f"bad_words: each word may hold at most {MAX_BAD_WORD_TOKENS} tokens, got {ids}")
            if any(t >= vocab for t in ids):
                raise RequestError(f"bad_words token ids must be in [0, {vocab}) for this model, got {ids}")
        if len(words) > MAX_BAD_WORDS:
            raise RequestError(f"bad_words: at most {MAX_BAD_WORDS} token sequences (a string counts with and without "
                               f"a leading space), got {len(words)}")
        return stops, words

    def _check_stop_limits(self, stops: list[str]) -> None:
        """The request's stop strings within max_stop_strings and max_stop_chars (RequestError)."""
        if len(stops) > self.cfg.max_stop_strings:
            raise RequestError(f"stop has {len(stops)} strings but at most {self.cfg.max_stop_strings} are allowed "
                               "(max_stop_strings)")
        chars = sum(len(s) for s in stops)
        if chars > self.cfg.max_stop_chars:
            raise RequestError(f"stop has {chars} characters in all but at most {self.cfg.max_stop_chars} are allowed "
                               "(max_stop_chars)")

    def _trace_for(self, request_id: str, max_tokens: int, params: SamplingParams) -> list[int]:
        """The trace entry of params.trace_id (default: the request id), checked against the request."""
        key = request_id if params.trace_id is None else params.trace_id
        depths = self.trace.get(key)
        if depths is None:
            if params.trace_id is None:
                raise RequestError(f"trace_id: none given and exit_trace has no entry for the request id {request_id!r}; "
                                   "set SamplingParams.trace_id (HTTP: the trace_id field) to the entry to replay")
            raise RequestError(f"trace_id {key!r} is not in exit_trace (its {len(self.trace)} entries include "
                               f"{sorted(self.trace)[:3]})")
        limit = min(params.max_loops or self.depth, self.depth)
        if depths[0] != self.depth:
            raise RequestError(f"exit_trace[{key!r}][0] must be the prefill depth {self.depth}, got {depths[0]}")
        if len(depths) < max_tokens:
            raise RequestError(f"exit_trace[{key!r}] has {len(depths)} depths but the request may produce {max_tokens} tokens")
        bad = [d for d in depths[1:max_tokens] if not 1 <= d <= limit]
        if bad:
            raise RequestError(f"exit_trace[{key!r}] depths must be in 1..{limit}, got {bad[:5]}")
        return depths

    def _tokenize(self, prompt) -> tuple[Optional[str], list[int]]:
        return tokenize_prompt(prompt, self.tokenizer)

    def abort_request(self, request_id: str, deltas: bool = False) -> Optional[RequestOutput]:
        """Abort a request at any time; its blocks return to the pool immediately. Returns its
        final output (with deltas=True what it added since its previous delta output, see step)."""
        group = self._groups.get(str(request_id))
        if group is None:
            return None
        for req in group:
            if not req.finished:
                self.scheduler.finish(req)
                self._steps.forget_swap(req)
                req.finish_reason = "abort"
                req.metrics.finished_time = time.monotonic()
        return self._finalize_group(str(request_id), deltas)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work() or self._pending is not None

    # ---- weights and the prefix cache ---------------------------------------------------------------
    @_on_device
    def update_weights(self, weights) -> None:
        """Write new weights into the model in place (models/weight_update.py), e.g. after a training
        step: `weights` are (hf_name, tensor) pairs, a whole checkpoint's or any part of it (names
        and shapes checked before anything is written; any dtype and device); tensors not given keep
        their values. Needs an engine without unfinished requests (RequestError). The prefix cache is
        reset: its K/V came from the old weights."""
        if self.has_unfinished_requests():
            raise RequestError("update_weights needs an idle engine: finish or abort the running requests first")
        if "weights" in self._asleep:
            raise RequestError("update_weights needs the weights awake: call wake_up(tags=['weights']) first")
        self.executor.update_weights(list(weights))
        self.reset_prefix_cache()  # (its K/V came from the old weights)

    @_on_device
    def sleep(self, level: int = 1) -> int:
        """Give back the device memory of the weights and the KV cache while the engine idles (e.g.
        while a trainer uses the GPU; executor/sleep.py; needs enable_sleep_mode): level 1 keeps
        the weights in host memory, level 2 discards them (`update_weights` refills them after
        `wake_up`). The prefix cache is reset. Needs an idle engine (RequestError); returns the
        bytes given back."""
        if not self.cfg.enable_sleep_mode:
            raise RequestError("sleep mode is off: build the engine with enable_sleep_mode=True (--enable-sleep-mode)")
        if level not in (1, 2):
            raise RequestError(f"sleep level must be 1 (weights kept in host memory) or 2 (weights discarded), got {level!r}")
        if self.has_unfinished_requests():
            raise RequestError("sleep needs an idle engine: finish or abort the running requests first")
        if self._asleep:
            raise RequestError("the engine is already asleep: call wake_up() first")
        self.reset_prefix_cache()  # (its K/V comes back as zeros)
        given = self.executor.sleep(level)
        self._asleep = ["weights", "kv_cache"]
        return given

    @_on_device
    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Take back the memory `sleep` gave: `tags` among "weights" and "kv_cache" (None: both; a
        tag already awake is skipped). Requests are taken again once both are back."""
        try:
            tags = check_tags(tags)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        waking = [t for t in tags if t in self._asleep]
        if waking:
            self.executor.wake_up(waking)
            self._asleep = [t for t in self._asleep if t not in waking]

    def is_sleeping(self) -> bool:
        """Whether any memory `sleep` gave back is still away."""
        return bool(self._asleep)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prompt prefix (blocks in use are freed when released); returns the
        cached blocks dropped."""
        return self.kv.pool.reset_prefix_cache()

    # ---- the step ------------------------------------------------------------------------------
    @_on_device
    def step(self, final_only: bool = False, deltas: bool = False) -> list[RequestOutput]:
        """Run one step; returns outputs of the requests that advanced or finished, or with
        final_only=True only of those that finished (cheaper for offline generation).

        Outputs are cumulative (each sample's whole output so far: O(output length) per request
        per step), or with deltas=True only what each sample added since the request's previous
        delta output (O(new tokens)): `token_ids`, `exit_depths`, `logprobs`, `text` and the
        request's `prompt_logprobs` hold the new entries (`outputs.OutputAccumulator` merges
        them back); `finish_reason`, `stop_reason` and `cumulative_logprob` are current values.
        Use one kind of output per request."""
        t0 = time.perf_counter()
        self._wait_s = 0.0
        self._profile_tick()
        touched: dict[str, None] = {}
        if self._pending is not None and self._pending.guided and self.cfg.speculative_config is not None:
            # A guided row's drafts and masks need the token the pending step commits: learn it
            # first (this step loses its overlap with the previous one).
            previous, self._pending = self._pending, None
            self._process(previous, touched)
        sched = self.scheduler.schedule()
        now = time.monotonic()
        for r in sched.admitted:
            if r.metrics.first_scheduled_time is None:
                r.metrics.first_scheduled_time = now
        # Without speculation, guided decode rows whose last token the pending step commits get their
        # masks late: the executor asks for them after submitting the forward (`_late_masks`).
        late_rows = [r for r in sched.decodes if r.matcher is not None] if self._pending is not None and (
            self._pending.guided) else []
        guided = self._fill_masks(sched, decode_rows=not late_rows) or bool(late_rows)
        handle = None
        if not sched.is_empty:
            step, live = self._steps.build(sched)
            guide = functools.partial(self._check_drafts, live) if step.guided_drafting() else None
            late = functools.partial(self._late_masks, late_rows, touched) if late_rows else None
            handle = self.executor.execute(step, guide, late)
            handle.guided, handle.live = guided, live
        self.num_steps += 1
        if self.async_scheduling:
            previous, self._pending = self._pending, handle
            if previous is not None:
                self._process(previous, touched)
        elif handle is not None:
            self._process(handle, touched)
        for r in sched.preempted:
            touched[r.group_id] = None
        outs = [self._output(g, deltas) for g in touched
                if g in self._groups and (not final_only or all(r.finished for r in self._groups[g]))]
        if self.timings is not None and handle is not None:
            self.timings.append(((time.perf_counter() - t0 - self._wait_s) * 1e3, self._last_device_ms))
        for out in outs:
            if out.finished:
                self._groups.pop(out.request_id, None)
                self._prompts.pop(out.request_id, None)
        return outs

    def _process(self, handle: StepHandle, touched: dict) -> None:
        t_wait = time.perf_counter()
        res = handle.result()
        self._wait_s += time.perf_counter() - t_wait
        self._last_device_ms = handle.device_ms()
        rounds = self.scheduler.greedy_rounds
        if rounds is not None and self._last_device_ms is not None and not handle.prefills:
            decode_rows = sum(1 for row in handle.rows if row[2] == "decode")
            if decode_rows:  # a decode-only step's device time teaches the greedy rows' round costs
                rounds.costs.record(decode_rows, handle.round_k, self._last_device_ms)
        live = handle.live
        for key, gen, n in handle.prefills:
            req = live[key]
            if gen != req.generation:
                continue
            req.num_computed += n
            req.num_inflight -= n
            self.scheduler.publish(req)
        if res is not None and res.prompt is not None:
            self._collect_prompt_logprobs([(live[key], *rest) for key, *rest in handle.prompt_rows], res.prompt)
        if res is None:
            return
        counts = (res.tokens >= 0).sum(axis=1).tolist()
        tokens, depths = res.tokens.tolist(), res.depths.tolist()
        for i, (key, gen, kind, k) in enumerate(handle.rows):
            req = live[key]
            committed = counts[i]
            if gen != req.generation or req.finished:
                continue
            if kind == "decode":
                req.num_computed += committed
                req.num_inflight -= 1 + k
            req.inflight_outputs -= 1
            if req.draft is not None:  # a decode round, or the token its prefill sampled (round 0)
                self.policy.observe(req.draft, k, committed)
            logprobs = res.logprobs is not None and req.wants_logprobs
            n = req.params.logprobs
            for j in range(committed):
                lp = None
                if logprobs:
                    value = float(res.logprobs[i, j])
                    req.cumulative_logprob += value
                    if n is not None:  # tolist(): the entries as Python ints and floats, one call per array
                        top_ids, top_lps = res.top_ids[i, j, :n].tolist(), res.top_logprobs[i, j, :n].tolist()
                        lp = TokenLogprob(value, dict(zip(top_ids, top_lps)))
                self._append(req, tokens[i][j], depths[i][j], lp)
                if req.finished:
                    break
            touched[req.group_id] = None
        if self.policy is not None and handle.round_k:
            rounds = [(k, counts[i] - 1) for i, (_, _, kind, k) in enumerate(handle.rows) if kind == "decode"]
            self._count_round(rounds)

    @staticmethod
    def _collect_prompt_logprobs(runs: list, arrays: dict) -> None:
        """Append each run's prompt log-probabilities (rows in run order) to its request, skipping
        positions it already has (a recompute after preemption runs them again)."""
        row = 0
        for req, gen, first, count in runs:
            if gen == req.generation and not req.finished:
                n = req.params.prompt_logprobs
                have = len(req.prompt_logprobs) + 1  # prompt index of the next entry it needs
                assert have >= first, f"{req.request_id}: prompt log-probabilities skip positions {have}..{first - 1}"
                for j in range(have - first, count):
                    i = row + j
                    top = {int(t): float(v) for t, v in zip(arrays["top_ids"][i][:n], arrays["top_logprobs"][i][:n])}
                    req.prompt_logprobs.append(TokenLogprob(float(arrays["logprobs"][i]), top))
            row += count

    def _count_round(self, rounds: list[tuple[int, int]]) -> None:
        """Stats of one round that ran: (drafts, accepted) per decode row."""
        drafted, accepted = [k for k, _ in rounds], [a for _, a in rounds]
        st = self.spec_stats
        st["rounds"] += 1
        st["drafted"] += sum(drafted)
        st["accepted"] += sum(accepted)
        st["committed"] += sum(accepted) + len(accepted)
        st["verify_rows"] += sum(drafted) + len(drafted)
        for a, d in zip(accepted, drafted):
            for pos in range(d):
                st["drafted_per_position"][pos] += 1
                st["accepted_per_position"][pos] += int(a > pos)

    def _append(self, req: Request, token: int, depth: int, lp: Optional[TokenLogprob]) -> None:
        req.output_token_ids.append(token)
        req.exit_depths.append(depth)
        if lp is not None:
            req.logprobs.append(lp)
        m = req.metrics
        m.loops_executed += depth
        if m.first_token_time is None:
            m.first_token_time = time.monotonic()
        tracker = self._trackers[id(req)]
        p = req.params
        if req.matcher is not None:
            if not req.matcher.accept_token(token):
                logger.error("%s: token %d is not allowed by its grammar; the request is aborted", req.request_id, token)
                self._finish(req, "abort", None)
                return
            if req.matcher.is_terminated():  # the grammar ended with EOS
                self._finish(req, "stop", token)
                return
        eos = () if p.ignore_eos else self._eos
        if token in (p.stop_token_ids or ()) or token in eos:
            self._finish(req, "stop", token)
            return
        hit = tracker.add(token)
        if hit is not None:
            self._finish(req, "stop", hit)
        elif p.repetition_detection is not None and p.repetition_detection.repeats(req.output_token_ids):
            self._finish(req, "stop", None)  # (the text's held-back tail is flushed)
            req.stop_reason = "repetition_detected"
        elif len(req.output_token_ids) >= req.max_tokens:
            self._finish(req, "length", None)

    def _finish(self, req: Request, reason: str, stop_reason) -> None:
        self.scheduler.finish(req)
        if reason != "stop" or not isinstance(stop_reason, str):
            hit = self._trackers[id(req)].finish()
            if hit is not None and reason == "length":  # the final flush completed a stop string
                reason, stop_reason = "stop", hit
        req.finish_reason, req.stop_reason = reason, stop_reason
        req.metrics.finished_time = time.monotonic()
        if self.cfg.record_exit_trace:
            self._recorded_trace[self._trace_key(req)] = list(req.exit_depths)
            self._write_trace()

    @staticmethod
    def _trace_key(req: Request) -> str:
        """The key a finished sequence's depths are recorded under: its trace_id (default: its
        request id), with the sample's "[i]" suffix when n > 1."""
        trace_id = req.params.trace_id
        if trace_id is None:
            return req.request_id
        return trace_id if req.params.num_samples == 1 else f"{trace_id}[{req.sample_index}]"

    def _write_trace(self) -> None:
        with open(self.cfg.record_exit_trace, "w", encoding="utf-8") as f:
            json.dump({"depth": self.depth, "depths_by_request": self._recorded_trace}, f)

    def _output(self, group_id: str, deltas: bool = False) -> RequestOutput:
        """The group's outputs, cumulative or as deltas (see step). With best_of > n: nothing until
        every sample finished, then the n samples with the highest cumulative log-probability
        (ties: lower sample index), indexed 0..n-1."""
        group = self._groups[group_id]
        finished = all(r.finished for r in group)
        params = group[0].params
        shown = group
        if params.num_samples > params.n:
            ranked = sorted(group, key=lambda r: (-r.cumulative_logprob, r.sample_index))
            shown = ranked[: params.n] if finished else []
        outs = []
        for index, req in enumerate(shown):
            tracker = self._trackers[id(req)]
            done = req.finished
            if deltas:
                sent = req.num_sent
                req.num_sent = len(req.output_token_ids)
                text, token_ids = tracker.take_delta(done), req.output_token_ids[sent:]
                exit_depths = req.exit_depths[sent:]
                logprobs = req.logprobs[sent:] if req.params.logprobs is not None else None
            else:
                text, token_ids = tracker.stable_text(done), list(req.output_token_ids)
                exit_depths = list(req.exit_depths)
                logprobs = list(req.logprobs) if req.params.logprobs is not None else None
            outs.append(CompletionOutput(
                index=index, text=text, token_ids=token_ids, exit_depths=exit_depths, finish_reason=req.finish_reason,
                logprobs=logprobs, stop_reason=req.stop_reason,
                cumulative_logprob=req.cumulative_logprob if req.wants_logprobs else None,
            ))
        if finished:
            for req in group:
                self._trackers.pop(id(req), None)
        first = group[0]
        prompt_lps = None
        if first.params.prompt_logprobs is not None:
            have = first.prompt_logprobs
            if not deltas:
                prompt_lps = [None, *have]
            else:  # entries [sent, 1 + len(have)) of [None, *have]
                sent, first.num_prompt_logprobs_sent = first.num_prompt_logprobs_sent, 1 + len(have)
                prompt_lps = [None, *have] if sent == 0 else have[sent - 1:]
        # Delta outputs share the request's prompt id list (never modified) instead of copying it.
        prompt_ids = first.prompt_token_ids if deltas else list(first.prompt_token_ids)
        return RequestOutput(group_id, self._prompts.get(group_id), prompt_ids, outs, finished,
                             metrics=first.metrics, prompt_logprobs=prompt_lps)

    def _finalize_group(self, group_id: str, deltas: bool = False) -> RequestOutput:
        out = self._output(group_id, deltas)
        self._groups.pop(group_id, None)
        self._prompts.pop(group_id, None)
        return out

    # ---- profiling and stats -------------------------------------------------------------------
    def _profile_tick(self) -> None:
        """The automatic trace of `profile_steps` (none while `start_profile` records)."""
        first, count = self.cfg.profile_steps
        if not self.cfg.profile_dir or not count or self._profile_manual:
            return
        if self.num_steps == first and self._profiler is None:
            from ..executor.profiling import start_profiler

            self._profiler = start_profiler()
        elif self._profiler is not None and self.num_steps == first + count:
            self._stop_profiler()

    def _stop_profiler(self) -> str:
        from ..executor.profiling import stop_profiler

        path = stop_profiler(self._profiler, self.cfg.profile_dir, self.device)
        self._profiler, self._profile_manual = None, False
        return path

    def start_profile(self) -> None:
        """Start a torch.profiler trace of the steps that follow (vLLM's `start_profile`); needs
        profile_dir, where `stop_profile` writes it (RequestError otherwise, or while one records)."""
        if not self.cfg.profile_dir:
            raise RequestError("start_profile needs profile_dir (--profile-dir): the directory the trace is written to")
        if self._profiler is not None:
            raise RequestError("a profile is already recording: call stop_profile() first")
        from ..executor.profiling import start_profiler

        self._profiler, self._profile_manual = start_profiler(), True
        logger.info("profiling started; stop_profile() writes the trace into %s", self.cfg.profile_dir)

    def stop_profile(self) -> list[str]:
        """Stop the trace `start_profile` began and write it (Chrome trace JSON) into profile_dir;
        returns its path, in a list as the front ends over several engines return theirs."""
        if self._profiler is None or not self._profile_manual:
            raise RequestError("no profile started by start_profile() is recording")
        return [self._stop_profiler()]

    def stats(self) -> dict:
        pool = self.kv.pool
        graphs = self.executor.graph_stats()
        return {
            "steps": self.num_steps,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_usage": self.kv.usage,
            "kv_blocks": pool.num_blocks,
            "prefix_cache_queries": pool.prefix_queries,
            "prefix_cache_hits": pool.prefix_hits,
            "preemptions": self.scheduler.num_preemptions,
            "memory_plan": self.memory_plan.as_dict(),
            "execution_mode": self.execution_mode,
            "async_scheduling": self.async_scheduling,
            **{name: graphs[name] for name in ("graphs", "prefill_graphs")},
            "speculative": self._spec_stats(),
        }

    def _spec_stats(self) -> Optional[dict]:
        if self.policy is None:
            return None
        st = dict(self.spec_stats)
        st["chosen_k"] = dict(self.policy.chosen)
        if self.scheduler.greedy_rounds is not None:  # what the greedy rows' round counts are priced at
            st["round_ms"] = self.scheduler.greedy_rounds.costs.table()
        st["graphs"] = self.executor.graph_stats()["speculative"]
        return st

    def shutdown(self) -> None:
        """Stop the executor's worker processes (tensor parallelism); nothing to do in process."""
        self.executor.shutdown()

    def check_invariants(self) -> None:
        """Block accounting and slot bookkeeping are consistent (for tests)."""
        self.kv.check_invariant()
        slots = [r.slot for r in self.scheduler.running]
        assert None not in slots and len(set(slots)) == len(slots), "slot assigned twice"
        assert len(slots) + len(self.scheduler.free_slots) == self.max_num_seqs, "slot leak"
