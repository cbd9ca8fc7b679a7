"""Command-line flags for every EngineConfig option, shared by rlt-generate, rlt-serve and rlt-bench."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing

from ..config import DRAFT_POLICIES, EngineConfig
from ..errors import ConfigError

HELP = {
    "dtype": "weights/activation dtype: auto (bf16 on CUDA, fp32 on CPU), float32, float16, bfloat16, float64 (CPU)",
    "quantization": "fp8: store the layers' linear weights as FP8 e4m3 with per-output-channel scales, quantized "
                    "at load; w8a8_fp8: the same, and the layers' input rows as FP8 (one power-of-two scale per row, "
                    "FP8 tensor-core products) (default: unquantized, in --dtype)",
    "kv_cache_dtype": "auto (K/V in the model dtype) or fp8 (FP8 e4m3 with per-(layer, KV head) scales)",
    "device": "auto, cpu, cuda or cuda:N",
    "tokenizer": "a tokenizer directory (tokenizer.json) or Hugging Face Hub name to use instead of the model's own",
    "revision": "Hub revision (branch, tag or commit) of a model given by Hub name (default: main)",
    "download_dir": "Hugging Face cache to read and download models into (default: $HF_HUB_CACHE, $HF_HOME/hub)",
    "seed": "engine seed (initialises presets and seeds requests without their own seed)",
    "data_parallel_size": "engine replicas, one process each (cuda:0..N-1 on CUDA, cuda:i*T.. with T tensor-parallel "
                          "ranks each, else the CPU); requests are routed by least outstanding work and shared "
                          "prompt prefix",
    "distributed_executor": "where replicas run: mp (processes on this host, default) or ray (Ray actors placed on "
                            "the Ray cluster at $RAY_ADDRESS or started last on this host, else a local one; "
                            "tensor_parallel_size GPUs each, on one node)",
    "disaggregated_prefill": "run prompts in a prefill engine process and hand each request's K/V to a decode "
                             "engine process (cuda:0 and cuda:1 on CUDA, else the CPU; docs/distributed.md)",
    "tensor_parallel_size": "ranks one model is split over (attention heads and MLP columns), one worker process "
                            "each (cuda:0..N-1 on CUDA, else the CPU; per replica with --data-parallel-size, in "
                            "the replica's Ray actor with --distributed-executor ray)",
    "prefill_address": "with --disaggregated-prefill: HOST:PORT of a prefill engine started apart with rlt-serve "
                       "--role prefill (then also --decode-address; both authenticate with $RLT_ROLE_KEY)",
    "decode_address": "with --disaggregated-prefill: HOST:PORT of a decode engine started apart with rlt-serve "
                      "--role decode",
    "role": "prefill or decode: serve that engine of disaggregated prefill to a front end started apart (with "
            "--role-address and --kv-transfer-address; no HTTP server)",
    "role_address": "with --role: HOST:PORT to listen on for the front end",
    "kv_transfer_address": "with --role: HOST:PORT on the prefill engine's host where the two engines' K/V transfer "
                           "group meets (the same on both)",
    "prefill_tensor_parallel_size": "with --disaggregated-prefill: the prefill engine's tensor-parallel ranks "
                                    "(default: --tensor-parallel-size, which sizes the decode engine)",
    "step_timeout_s": "seconds a tensor-parallel rank may take to answer a step, and a data-parallel replica "
                      "process may stay silent while it has requests, before it is failed as hung (its "
                      "requests end with an error; default 300; inf: wait forever)",
    "num_loops": "override the model depth (Ouro loops 1..8, Huginn recurrences 1..128)",
    "max_model_len": "context length limit (default: the model's)",
    "max_num_seqs": "maximum running requests (default 256 on CUDA, 16 on CPU)",
    "max_num_batched_tokens": "token budget of one step (decode rows + prefill chunk tokens)",
    "enable_chunked_prefill": "split long prompts into chunks that share steps with decode",
    "prefill_chunk_size": "largest prefill chunk of one request in one step",
    "max_consecutive_prefill_steps": "prefill-only steps in a row before a decode step (chunked prefill off)",
    "scheduling_policy": "fcfs or priority (lower SamplingParams.priority runs first)",
    "admission_scan_limit": "waiting requests examined per admission pass",
    "max_admission_bypasses": "times a blocked request may be passed by later ones",
    "enable_preemption": "preempt requests under KV memory pressure",
    "preemption_mode": "recompute (default) or swap (K/V to CPU)",
    "block_size": "tokens per KV block (16..256)",
    "kv_layout": "last_exited (per-loop planes), shared (one plane), Huginn: compress-sN",
    "enable_prefix_caching": "share full prompt blocks across requests",
    "gpu_memory_utilization": "fraction of GPU memory the engine may use",
    "num_blocks": "KV pool size in blocks (overrides planning)",
    "kv_cache_memory_bytes": "KV pool size in bytes (overrides planning)",
    "watermark": "fraction of blocks kept free when admitting while others run",
    "exit_mode": "Ouro: ouro, ouro_delayed, random_lookahead, trace; Huginn: fixed, kl, entropy-diff, latent-diff, cosine, argmax-stability, trace",
    "exit_trace": "JSON file of recorded exit depths to replay (exit_mode trace)",
    "record_exit_trace": "write every request's exit depths to this JSON file",
    "lookahead_seed": "seed of random_lookahead's frozen head",
    "exit_criterion_threshold": "threshold of Huginn's zero-shot exit criterion",
    "attention_backend": "auto, triton, flash or torch (an explicit choice never falls back; flash needs "
                         "batch_invariant=False, docs/options.md)",
    "last_exited_reads": "indirect (key-depth table in the attention kernel) or copy (finalize copies); default "
                         "indirect, copy with the flash backend",
    "execution_mode": "eager, graphs (CUDA graphs) or compile (torch.compile reduce-overhead)",
    "async_scheduling": "overlap host scheduling of step N+1 with device step N",
    "batch_invariant": "results independent of batch composition (fixed kernel tiles)",
    "cuda_graph_sizes": "decode row buckets captured as CUDA graphs",
    "speculative_config": "JSON: {\"num_speculative_tokens\": K, \"draft_loops\": d, \"draft_policy\": \"adaptive\", "
                          "\"disable_by_batch_size\": 64}",
    "max_stop_strings": "most stop strings one request may give (default 128; more is a 400 naming stop)",
    "max_stop_chars": "most characters one request's stop strings may hold in all (default 4096)",
    "enable_penalties": "keep the per-slot state of repetition/presence/frequency penalties (max_num_seqs x vocab "
                        "x 5 bytes); off: those fields are a 400",
    "generation_config": "default sampling parameters: 'auto' (the model's generation_config.json: temperature, top_p, "
                         "top_k, min_p, repetition_penalty, max_new_tokens), 'vllm' (none), or a directory holding one",
    "enable_sleep_mode": "allow LLM.sleep / wake_up (and the server's POST /sleep, POST /wake_up, GET /is_sleeping): "
                         "the weights' and KV cache's device memory given back while idle; not with compile mode",
    "profile_dir": "write a torch.profiler trace of some steps here",
    "profile_steps": "first step and number of steps to profile (COUNT 0: none; traces only between start_profile and "
                     "stop_profile, e.g. the server's POST /start_profile and /stop_profile)",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


VLLM_FLAGS = {
    "enforce_eager": (None, "vLLM name: same as --execution-mode eager"),
    "disable_log_stats": (None, "vLLM name: accepted; rlt logs no periodic stats (see /metrics, LLM.stats())"),
    "trust_remote_code": (None, "vLLM name: accepted; rlt never runs code from a checkpoint"),
    "swap_space": (float, "vLLM name: only 0 (no CPU swap budget; see --preemption-mode)"),
    "load_format": (str, "vLLM name: 'auto' or 'safetensors' (rlt reads safetensors checkpoints)"),
    "tokenizer_mode": (str, "vLLM name: 'auto' (rlt reads tokenizer.json with the tokenizers library)"),
}


def add_engine_args(parser: argparse.ArgumentParser, skip=()) -> None:
    """Add one flag per EngineConfig field (defaults None: the engine decides), plus the vLLM names
    users type by habit (translated or rejected by rlt_runtime/vllm_options.py)."""
    hints = typing.get_type_hints(EngineConfig)
    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        if f.name in ("extra",) or f.name in skip:
            continue
        hint = hints[f.name]
        kw: dict = {"default": None, "help": HELP.get(f.name, "")}
        base = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        t = base[0]
        if t is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif f.name == "cuda_graph_sizes":
            kw.update(type=int, nargs="+")
        elif f.name == "profile_steps":
            kw.update(type=int, nargs=2, metavar=("FIRST", "COUNT"))
        elif f.name == "speculative_config":
            kw["type"] = json.loads
        elif t in (int, float, str):
            kw["type"] = t
        else:
            kw["type"] = str
        group.add_argument(_flag(f.name), dest=f"engine_{f.name}", **kw)
    vllm = parser.add_argument_group("vLLM option names (mapped to rlt options, or an error naming rlt's)")
    for name, (t, text) in VLLM_FLAGS.items():
        if t is None:
            vllm.add_argument(_flag(name), dest=f"vllm_{name}", action="store_true", default=None, help=text)
        else:
            vllm.add_argument(_flag(name), dest=f"vllm_{name}", type=t, default=None, metavar=name.upper(), help=text)
    spec = parser.add_argument_group("speculative decoding (shorthand for --speculative-config)")
    spec.add_argument("--speculative-tokens", dest="spec_num_speculative_tokens", type=int, default=None,
                      help="draft tokens per round (K)")
    spec.add_argument("--draft-loops", dest="spec_draft_loops", type=int, default=None, help="loops the draft runs (d)")
    spec.add_argument("--draft-policy", dest="spec_draft_policy", choices=DRAFT_POLICIES, default=None,
                      help="adaptive (choose k per round) or fixed (always K)")
    spec.add_argument("--speculative-disable-by-batch-size", dest="spec_disable_by_batch_size", type=int, default=None,
                      help="greedy rows draft none while more requests than this run or wait (default 64)")


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine options the user set on the command line (speculative shorthand folded in)."""
    out = {}
    shorthand = {}
    for key, value in vars(args).items():
        if value is None:
            continue
        if key.startswith("engine_"):
            name = key[len("engine_"):]
            out[name] = tuple(value) if name == "profile_steps" else value
        elif key.startswith("spec_"):
            shorthand[key[len("spec_"):]] = value
        elif key.startswith("vllm_"):
            out[key[len("vllm_"):]] = value
    if shorthand:
        if "speculative_config" in out:
            raise ConfigError("give either --speculative-config or --speculative-tokens/--draft-loops/--draft-policy/"
                              "--speculative-disable-by-batch-size")
        if "num_speculative_tokens" not in shorthand:
            raise ConfigError("--draft-loops/--draft-policy/--speculative-disable-by-batch-size need --speculative-tokens")
        out["speculative_config"] = shorthand
    return out
