"""Mutation check: inject known bugs into a temporary copy of the repository and confirm that the
tests chosen to catch each one fail.

    python tests/mutants.py [--clean] [NAME ...]     (from the repository root; default: every mutant)

For each mutant the packages, tests/ and pytest.ini are copied to a temporary directory, one
source line is replaced there (never in place), and `pytest -x -q -m '' <kill tests>` (slow tests
included) runs in that copy with the copy first on sys.path and PYTHONPATH, two mutants at a time.
Each run is a process forked from a server that has already imported the heavy third-party
modules (PRELOADED), so a run does not pay their import time; the code under test is never
imported there. A mutant is "killed" when the tests fail (pytest exit status 1), "survived" when
they pass; any other status (collection error, no tests found, a crash) is an error. `--clean`
runs the same selections on an unmodified copy instead (they must all pass).

Adding a mutant: append a Mutant to MUTANTS (or put it first if its tests take tens of seconds:
runs start in this order, so the slow ones overlap the rest; a kill run of 20 s or more also goes
into SLOW, which the default test suite leaves to `-m slow`) with the file, the exact source line
to replace (compared without its indentation, which the replacement keeps) and the node ids of the
few fast tests that must catch it; then run the script and check the mutant is reported killed, and
that `--clean` passes. The line must occur exactly once in the file: when a refactor changes or
removes it, the script reports an error naming the mutant, instead of silently testing an
unmutated copy; re-point the mutant at the line that now carries the code.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import multiprocessing
import os
import shutil
import sys
import tempfile
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("rlt_kernels", "rlt_runtime", "perf", "tests", "pytest.ini")
IGNORED = shutil.ignore_patterns("__pycache__", ".hypothesis", ".pytest_cache", "*.egg-info")
# Third-party modules the fork server imports once: those that take 0.1 s or more to import in a
# run (measured with -X importtime), pytest plugins included; -W below keeps pytest from warning
# that it cannot assert-rewrite them. Not triton: it decides at import whether its own helpers are
# interpreted, from the TRITON_INTERPRET that conftest sets in each run (and imports in 0.15 s).
PRELOADED = ("torch", "torch.distributed.tensor", "numpy", "xgrammar", "transformers", "pytest", "hypothesis",
             "schemathesis.pytest.plugin")
NOT_STARTED = 99  # exit status of a run whose pytest could not start


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # file to patch, relative to the repository root
    line: str  # the exact source line to replace, without indentation
    replacement: str  # its replacement, without indentation
    tests: tuple[str, ...]  # pytest node ids that must fail with the mutant applied
    bug: str  # what the mutant breaks


# Mutants whose kill runs take 20-60 s each on two cores (the conformance runner's planted faults,
# multi-process tensor-parallel and remote engines waiting on their failing peers): the default
# suite leaves them to `python -m pytest -m slow` (tests/test_mutants.py marks them), this script
# runs them with the others.
SLOW = frozenset({"conformance-never-reruns-alone", "pd-tp-heads-joined-in-reverse", "tp-ranks-drop-late-masks",
                  "remote-roles-unchecked", "pd-tp-import-shares-reversed", "conformance-crowd-keeps-old-weights"})

MUTANTS = (
    Mutant(
        "conformance-never-reruns-alone", "perf/conformance.py",
        "if workers > 1 and len(cases) > 1:",
        "if False:",
        ("tests/runtime/test_conformance.py::test_runner_passes_real_cases_and_fails_on_planted_faults",),
        "a case that timed out only because others shared the GPU is reported as a timeout",
    ),
    Mutant(
        "fixed-steps-ignore-thresholds", "rlt_runtime/models/exit_rules.py",
        "return threshold < 1.0",
        "return False",
        ("tests/runtime/test_fixed_depth_steps.py::test_fixed_depth_steps_match_the_full_path[ouro-tiny]",),
        "steps of rows with exit_threshold < 1 take the fixed-depth program, so those rows never exit early",
    ),
    Mutant(
        "full-depth-pass-reports-one-loop-less", "rlt_runtime/executor/model_runner.py",
        "return RowResults(rs.h, torch.full((rs.h.shape[0],), self.depth, dtype=torch.int32, device=self.device))",
        "return RowResults(rs.h, torch.full((rs.h.shape[0],), self.depth - 1, dtype=torch.int32, device=self.device))",
        ("tests/runtime/test_fixed_depth_steps.py::test_fixed_depth_steps_match_the_full_path[ouro-tiny]",),
        "decode steps on the fixed-depth path report every row's exit depth one loop short",
    ),
    Mutant(
        "speculative-logprobs-zero", "rlt_runtime/executor/speculative.py",
        "lp[put_r, vj] = chosen",
        "lp[put_r, vj] = torch.zeros_like(chosen)",
        ("tests/runtime/test_logprobs.py::test_greedy_speculation_reports_plain_logprobs_bitwise[ouro-tiny-1.0]",),
        "speculative rounds report log-probability 0 for every committed token",
    ),
    Mutant(
        "decode-logprob-of-argmax", "rlt_runtime/executor/model_runner.py",
        "chosen, top_ids, top_lp = ops.compute_logprobs(logits, tokens, num_top)",
        "chosen, top_ids, top_lp = ops.compute_logprobs(logits, logits.argmax(dim=1), num_top)",
        ("tests/runtime/test_logprobs.py::test_logprobs_match_the_reference[ouro-tiny-0.8-False]",),
        "plain decoding reports the argmax's log-probability instead of the sampled token's",
    ),
    Mutant(
        "draft-proposal-at-temperature-1", "rlt_runtime/executor/speculative.py",
        "ops.filtered_probs(logits, temp, top_k, top_p, min_p, out=q[:, j], active_rows=count)",
        "ops.filtered_probs(logits, torch.ones_like(temp), top_k, top_p, min_p, out=q[:, j], active_rows=count)",
        ("tests/runtime/test_speculative_distribution.py::test_sampled_speculation_on_peaked_logits",),
        "rejection sampling uses the draft distribution at temperature 1, not the one the drafts were drawn from",
    ),
    Mutant(
        "round-logprob-ids-unmasked", "rlt_runtime/executor/speculative.py",
        "committed = torch.where(in_use & (out_tokens[vr, vj] >= 0), out_tokens[vr, vj], torch.zeros_like(vr))",
        "committed = out_tokens[vr, vj].clamp(min=0)",
        ("tests/runtime/test_speculative.py::test_rounds_pass_only_in_range_ids_to_kernels_when_no_row_is_written",),
        "rows acceptance did not write (a capture's warm-up) reach the logprobs kernel as token ids",
    ),
    Mutant(
        "table-writes-duplicated", "rlt_runtime/cache/kv_cache.py",
        "return [(p, s, l, b) for (p, s, l), b in last.items()]",
        "return updates",
        ("tests/runtime/test_scheduler.py::test_a_step_writes_each_table_entry_once_with_its_last_value",),
        "a slot reused within a step sends duplicate block-table writes (undefined order on the GPU)",
    ),
    Mutant(
        "repetition-penalty-divides-negative-logits", "rlt_runtime/executor/logit_processing.py",
        "x = torch.where(self.prompt_mask[idx] | seen, torch.where(x > 0, x / rep, x * rep), x)",
        "x = torch.where(self.prompt_mask[idx] | seen, x / rep, x)",
        ("tests/runtime/test_logit_processing.py::test_apply_matches_the_reference_per_row",),
        "the repetition penalty divides negative logits too, raising repeated tokens it should lower",
    ),
    Mutant(
        "min-tokens-one-too-many", "rlt_runtime/executor/logit_processing.py",
        "early = (out_pos - self.prompt_len[idx]) < self.min_tokens[idx]",
        "early = (out_pos - self.prompt_len[idx]) <= self.min_tokens[idx]",
        ("tests/runtime/test_logit_processing.py::test_min_tokens_holds_back_eos_and_stop_ids_exactly",),
        "min_tokens holds EOS and stop ids back for one token more than asked",
    ),
    Mutant(
        "penalty-counts-lost-on-preemption", "rlt_runtime/executor/logit_processing.py",
        "o_tok += r.output_token_ids",
        "o_row = o_row[: len(o_tok)]",
        ("tests/runtime/test_logit_processing.py::test_preemption_restores_the_counts[0.0-recompute]",),
        "a preempted request resumes with its output-token counts reset, so its penalties change",
    ),
    Mutant(
        "guided-mask-not-applied", "rlt_runtime/executor/model_runner.py",
        "chosen_from = self.token_mask.apply(self.logit_proc.apply(logits, idx, out_positions), idx, logits)",
        "chosen_from = self.logit_proc.apply(logits, idx, out_positions)",
        ("tests/runtime/test_guided_decoding.py::test_json_schema_output_parses_and_validates[0.0]",),
        "guided rows sample from unmasked logits, so their output ignores the grammar",
    ),
    Mutant(
        "guided-mask-wrong-row", "rlt_runtime/executor/token_mask.py",
        "return self.apply_rows(logits, self.mask.index_select(0, idx), raw)",
        "return self.apply_rows(logits, self.mask[: logits.shape[0]], raw)",
        ("tests/runtime/test_guided_decoding.py::test_slot_rows_follow_their_slots",
         "tests/runtime/test_guided_decoding.py::test_guided_and_unguided_requests_in_an_async_crowd_match_running_alone"),
        "a row takes the mask of the slot at its batch position instead of its own slot's",
    ),
    Mutant(
        "guided-eos-never-allowed", "rlt_runtime/engine/grammar.py",
        "return self.xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))",
        "return self.xgr.GrammarMatcher(compiled, override_stop_tokens=[self.vocab_size - 1])",
        ("tests/runtime/test_guided_decoding.py::test_eos_only_when_the_grammar_can_end",),
        "the grammar's end allows another token instead of EOS, so guided requests never stop on EOS",
    ),
    Mutant(
        "structural-tag-triggers-dropped", "rlt_runtime/engine/grammar.py",
        'return self.compiler.compile_structural_tag(items, list(tag["triggers"]))',
        "return self.compiler.compile_structural_tag(items, [])",
        ("tests/runtime/test_guided_decoding.py::test_structural_tag_in_vllms_form_constrains_every_triggered_segment",),
        "a structural tag in vLLM's form compiles without its triggers, so no segment is ever constrained",
    ),
    Mutant(
        "response-format-structural-tag-ignored", "rlt_runtime/entrypoints/server/protocol.py",
        'return {"structural_tag": dict(rf)}',
        "return None",
        ("tests/server/test_structured_output.py::test_response_format_structural_tag_in_vllms_form",),
        "response_format of type structural_tag is accepted but constrains nothing",
    ),
    Mutant(
        "structured-outputs-ignored", "rlt_runtime/entrypoints/server/protocol.py",
        "return given or None",
        "return None",
        ("tests/server/test_structured_output.py::test_vllm_structured_outputs",),
        "vLLM's structured_outputs is accepted but constrains nothing",
    ),
    Mutant(
        "streamed-chat-token-ids-cumulative", "rlt_runtime/entrypoints/server/app.py",
        "token_ids=self.token_ids(c.token_ids[first:end]))])",
        "token_ids=self.token_ids(c.token_ids[:end]))])",
        ("tests/server/test_return_token_ids.py::test_chat_carries_prompt_ids_on_the_response_and_generated_ids_per_choice",),
        "a streamed chat chunk carries every token id so far instead of its new ones",
    ),
    Mutant(
        "include-reasoning-ignored", "rlt_runtime/entrypoints/server/app.py",
        "reasoning = None",
        "pass",
        ("tests/server/test_chat_templates.py::test_include_reasoning_false_leaves_the_reasoning_out",),
        "include_reasoning: false still returns the reasoning in the message",
    ),
    Mutant(
        "offline-chat-without-end-of-turn-stops", "rlt_runtime/entrypoints/llm.py",
        "stops = tok.chat_stop_token_ids",
        "stops = ()",
        ("tests/runtime/test_llm_chat.py::test_the_end_of_turn_token_stops_chat_unless_eos_is_ignored",),
        "offline chat runs past the template's end-of-turn token",
    ),
    Mutant(
        "responses-reasoning-tokens-short-by-one", "rlt_runtime/entrypoints/server/app.py",
        "return lo",
        "return lo - 1",
        ("tests/server/test_chat_templates.py::test_responses_api_splits_the_reasoning_into_its_own_item",),
        "the Responses API counts one reasoning token fewer than the answer spent before its end marker",
    ),
    Mutant(
        "responses-reasoning-item-left-open", "rlt_runtime/entrypoints/server/app.py",
        'return self._finish("completed") if self.open is not None else []',
        "return []",
        ("tests/server/test_chat_templates.py::test_responses_api_splits_the_reasoning_into_its_own_item",),
        "a streamed response opens its message item while the reasoning item is still open",
    ),
    Mutant(
        "guided-matcher-not-advanced", "rlt_runtime/engine/llm_engine.py",
        "if not req.matcher.accept_token(token):",
        "if False:",
        ("tests/runtime/test_guided_decoding.py::test_json_object_regex_choice_and_grammar",),
        "committed tokens never advance the matcher, so every mask is the grammar's first",
    ),
    Mutant(
        "guided-verify-mask-of-position-0", "rlt_runtime/executor/speculative.py",
        "words = words.index_copy(0, put, guided_words)",
        "words = words",
        ("tests/runtime/test_guided_decoding.py::test_greedy_guided_speculation_is_plain_guided_decoding[ouro-tiny-fixed]",),
        "a guided row's verify positions all take the mask of its first (the committed output's), not the "
        "grammar's after the drafts before them",
    ),
    Mutant(
        "guided-drafts-not-rolled-back", "rlt_runtime/engine/llm_engine.py",
        "matcher.rollback(taken)",
        "matcher.rollback(0)",
        ("tests/runtime/test_guided_decoding.py::test_draft_checks_mask_each_verify_position_and_roll_back",
         "tests/runtime/test_guided_decoding.py::test_greedy_guided_speculation_is_plain_guided_decoding[ouro-tiny-fixed]"),
        "checking drafts leaves them in the matcher, which then holds tokens that were never committed",
    ),
    Mutant(
        "huginn-prompt-noise-per-request", "rlt_runtime/executor/model_runner.py",
        "keys += [self.prompt_key] * in_prompt + [c.request.row_key] * (n - in_prompt)",
        "keys += [c.request.row_key] * n",
        ("tests/runtime/test_prefix_sharing.py::test_huginn_prefix_cache_hit_equals_a_fresh_engine",),
        "Huginn's prompt K/V depends on the request's noise key, and cached prompt blocks leak it",
    ),
    Mutant(
        "prompt-logprobs-rows-shifted", "rlt_runtime/executor/model_runner.py",
        "prompt_rows += range(qsl[-1], qsl[-1] + count)",
        "prompt_rows += range(qsl[-1] + 1, qsl[-1] + 1 + count)",
        ("tests/runtime/test_prompt_logprobs.py::test_prompt_logprobs_match_the_reference[ouro-tiny]",),
        "a prompt token's log-probability is read at its own position instead of the one before it",
    ),
    Mutant(
        "recomputed-outputs-take-the-previous-depth", "rlt_runtime/engine/request.py",
        "return [full_depth] * max(min(end, p) - start, 0) + self.exit_depths[max(start - p, 0) + 1:max(end - p, 0) + 1]",
        "return [full_depth] * max(min(end, p) - start, 0) + self.exit_depths[max(start - p, 0):max(end - p, 0)]",
        ("tests/runtime/test_preemption_outputs.py::test_preempted_requests_keep_every_output[0.0-huginn-tiny-recompute]",),
        "an output recomputed after preemption runs the loops of the output before it (its K/V then differs)",
    ),
    Mutant(
        "prefix-keys-not-chained", "rlt_runtime/cache/kv_cache.py",
        "parent = hashlib.blake2b(parent + key + raw[start : start + width], digest_size=8).digest()",
        "parent = hashlib.blake2b(bytes(8) + key + raw[start : start + width], digest_size=8).digest()",
        ("tests/runtime/test_scheduler.py::test_prompt_block_hashes_chain_over_the_prefix_and_skip_the_last_token",),
        "a prompt block's cache key ignores the blocks before it: another prompt's equal block is a false hit",
    ),
    Mutant(
        "prompt-logprobs-prefix-hit", "rlt_runtime/engine/scheduler.py",
        "hashes = [] if r.needs_prompt_logprobs else self.prompt_hashes(r)",
        "hashes = self.prompt_hashes(r)",
        ("tests/runtime/test_prompt_logprobs.py::test_prompt_logprobs_do_not_depend_on_scheduling[ouro-tiny]",),
        "a prefix-cache hit skips prompt positions whose log-probabilities were asked for",
    ),
    Mutant(
        "data-parallel-arrival-order-lost", "rlt_runtime/engine/data_parallel.py",
        "arrival_time=now, arrival_index=arrival)",
        "arrival_time=now, arrival_index=None)",
        ("tests/runtime/test_data_parallel.py::test_in_process_replicas_match_one_engine_bit_for_bit[ouro-tiny]",),
        "replicas number arrivals themselves, so unseeded samples draw other streams than one engine's",
    ),
    Mutant(
        "data-parallel-prefix-affinity-off", "rlt_runtime/engine/routing.py",
        "if home is not None and alive[home] and self.work[home] <= self.work[least] + self.affinity_slack:",
        "if False:",
        ("tests/runtime/test_data_parallel.py::test_a_shared_prefix_follows_its_replica_and_hits_its_cache",),
        "a shared prompt prefix goes to the least loaded replica, away from the one whose cache holds it",
    ),
    Mutant(
        "text-delta-streams-stop-prefix", "rlt_runtime/engine/text.py",
        "return self._stop.pending",
        "return 0",
        ("tests/runtime/test_output_deltas.py::test_a_stop_string_split_across_two_steps_is_held_then_cut",),
        "text deltas stream the start of a stop string that the next step completes (it can never be taken back)",
    ),
    Mutant(
        "output-delta-repeats-tokens", "rlt_runtime/engine/llm_engine.py",
        "req.num_sent = len(req.output_token_ids)",
        "req.num_sent = req.num_sent",
        ("tests/runtime/test_output_deltas.py::test_abort_with_deltas_returns_only_what_is_new",),
        "every delta output repeats the tokens earlier deltas already handed out",
    ),
    Mutant(
        "stop-string-before-min-tokens", "rlt_runtime/engine/text.py",
        "if hit is None or self._num_tokens <= self._min_tokens:",
        "if hit is None:",
        ("tests/runtime/test_stop_strings.py::test_min_tokens_hold_back_stop_strings_as_vllm_does",),
        "a stop string in the text of the first min_tokens tokens ends the request (vLLM ignores it there)",
    ),
    Mutant(
        "kv-plan-ignores-penalty-state", "rlt_runtime/cache/memory.py",
        "budget = (int(total * cfg.gpu_memory_utilization) - weights_bytes - state_bytes - peak - graph_reserve_bytes",
        "budget = (int(total * cfg.gpu_memory_utilization) - weights_bytes - peak - graph_reserve_bytes",
        ("tests/runtime/test_logit_processing.py::test_kv_planner_sets_the_penalty_state_aside",),
        "the KV pool is sized as if the per-slot penalty state took no memory",
    ),
    Mutant(
        "skinny-swiglu-up-rows", "rlt_kernels/gemm.py",
        "u_ptrs = w_ptr + (cols + n_out).to(tl.int64)[:, None] * stride_w + (k_lo + ks)[None, :]",
        "u_ptrs = w_ptr + (cols + 1).to(tl.int64)[:, None] * stride_w + (k_lo + ks)[None, :]",
        ("tests/kernels/test_gemm.py::test_linear_transposed_skinny_tiles_keep_the_bits[swiglu-160-136-weight_dtype0]",),
        "the transposed skinny decode tile reads SwiGLU's up rows from the wrong place",
    ),
    Mutant(
        "data-parallel-ignores-tensor-parallel-gpus", "rlt_runtime/engine/data_parallel.py",
        'return [f"cuda:{i * tp}" for i in range(n)]',
        'return [f"cuda:{i}" for i in range(n)]',
        ("tests/runtime/test_data_tensor_parallel.py::test_each_replica_takes_its_own_tensor_parallel_size_gpus",),
        "replicas of a tensor-parallel engine start one GPU apart, so replica r's rank 1 shares a GPU with replica r+1's rank 0",
    ),
    Mutant(
        "fused-norm-drops-a-split", "rlt_kernels/norms.py",
        "for s in tl.static_range(SPLITS):",
        "for s in tl.static_range(SPLITS - 1):",
        ("tests/kernels/test_linear_norm.py::test_fused_equals_linear_then_residual_norm[4096-True-ouro-weight_dtype0]",),
        "the residual norm adds all but the last of a split-K linear's partials",
    ),
    Mutant(
        "range-merge-before-the-last-range", "rlt_kernels/attention.py",
        'if tl.atomic_add(counter, done, sem="acq_rel", scope="gpu") == n_ranges - done:',
        'if tl.atomic_add(counter, done, sem="acq_rel", scope="gpu") == n_ranges - done - 1:',
        ("tests/kernels/test_attention.py::test_decode_ranges_merged_in_place",),
        "a split decode row is merged by its next-to-last range program, before the last range's partial is stored",
    ),
    Mutant(
        "late-masks-not-written", "rlt_runtime/executor/model_runner.py",
        "self.token_mask.write([], *late_masks())",
        "late_masks()",
        ("tests/runtime/test_guided_decoding.py::test_async_guided_steps_build_masks_while_the_forward_runs",),
        "an async decode step after a guided step samples its guided rows under the masks of the step before",
    ),
    Mutant(
        "tp-ranks-drop-late-masks", "rlt_runtime/executor/multiproc.py",
        "return slots, masks",
        "return [], masks[:0]",
        ("tests/runtime/test_tensor_parallel.py::test_async_guided_steps_send_their_late_masks_after_the_step",),
        "tensor-parallel ranks sample an async step's guided rows without the masks the engine sent after the step",
    ),
    Mutant(
        "pd-tp-heads-joined-in-reverse", "rlt_runtime/executor/multiproc.py",
        "return [[torch.cat([copies[i][0] for copies in per_rank], dim=3),",
        "return [[torch.cat([copies[i][0] for copies in reversed(per_rank)], dim=3),",
        ("tests/runtime/test_disaggregated_prefill.py::test_tensor_parallel_engines_hand_off_bit_for_bit[two requests-inprocess]",),
        "a tensor-parallel prefill engine's handoff joins its ranks' K heads in the wrong order",
    ),
    Mutant(
        "pd-tp-import-shares-reversed", "rlt_runtime/executor/multiproc.py",
        "shares = zip(k.chunk(self.size, dim=3), v.chunk(self.size, dim=3))",
        "shares = zip(reversed(k.chunk(self.size, dim=3)), reversed(v.chunk(self.size, dim=3)))",
        ("tests/runtime/test_disaggregated_prefill.py::test_engines_of_different_tensor_parallel_sizes_hand_off[1-2]",),
        "a tensor-parallel decode engine gives each rank another rank's share of the K/V heads handed to it",
    ),
    Mutant(
        "decode-fp8-read-as-bytes", "rlt_kernels/attention.py",
        "if k_head.dtype.element_ty == tl.float8e4nv and KV_ALIGNED and HEAD_DIM % 4 == 0:",
        "if False:",
        ("tests/kernels/test_sm90_codegen.py::test_decode_attention_widens_fp8_words_without_byte_unpacking",),
        "the decode kernel reads FP8 caches byte by byte again (per-byte unpacking made it issue-bound on the GPU)",
    ),
    Mutant(
        "fp8-words-widened-out-of-order", "rlt_kernels/_widen.py",
        "x = tl.join(tl.join(e0, e2), tl.join(e1, e3))",
        "x = tl.join(tl.join(e0, e1), tl.join(e2, e3))",
        ("tests/kernels/test_widen.py::test_word_widening_is_exact_for_every_value_in_element_order",),
        "an FP8 word's bytes land at the wrong head-dimension elements of the widened tile",
    ),
    Mutant(
        "fp8-widening-through-the-cast", "rlt_kernels/_widen.py",
        "if INLINE and like.dtype == tl.bfloat16:",
        "if False:",
        ("tests/kernels/test_sm90_codegen.py::test_fp8_linear_widens_with_integer_instructions",
         "tests/kernels/test_sm90_codegen.py::test_tile_attention_widens_fp8_keys_with_integer_instructions"),
        "FP8 weight and K/V tiles are widened by Triton's cast again (a slow f16 -> bf16 conversion per element on the GPU)",
    ),
    Mutant(
        "crowded-steps-never-stop-greedy-drafts", "rlt_runtime/engine/scheduler.py",
        "crowded = limit is not None and len(self.running) + len(self.waiting) > limit  # greedy rows draft none",
        "crowded = False  # greedy rows draft none",
        ("tests/runtime/test_speculative.py::test_greedy_rows_stop_drafting_in_crowded_steps",),
        "speculative_config.disable_by_batch_size is ignored: greedy rows draft in steps of any batch",
    ),
    Mutant(
        "crowded-steps-ignore-waiting-requests", "rlt_runtime/engine/scheduler.py",
        "crowded = limit is not None and len(self.running) + len(self.waiting) > limit  # greedy rows draft none",
        "crowded = limit is not None and len(decoding) > limit  # greedy rows draft none",
        ("tests/runtime/test_speculative.py::test_waiting_requests_count_toward_disable_by_batch_size",),
        "disable_by_batch_size counts only the step's decoding rows: a burst drafts while its prompts are admitted",
    ),
    Mutant(
        "greedy-drafts-never-lifted", "rlt_runtime/engine/scheduler.py",
        "budget = self._greedy_drafts(out, budget)",
        "pass",
        ("tests/runtime/test_speculative.py::test_greedy_rows_draft_what_the_round_runs",),
        "greedy rows draft only what their own estimates pick, in rounds that run more drafts for other rows",
    ),
    Mutant(
        "sampled-drafts-lifted", "rlt_runtime/engine/scheduler.py",
        "greedy = [i for i, r in enumerate(out.decodes) if r.draft is not None and r.params.greedy]",
        "greedy = [i for i, r in enumerate(out.decodes) if r.draft is not None]",
        ("tests/runtime/test_speculative.py::test_greedy_rows_draft_what_the_round_runs",),
        "sampled rows are lifted to the round's count: their counts (and seeded tokens) depend on the batch",
    ),
    Mutant(
        "crowded-steps-stop-sampled-drafts", "rlt_runtime/engine/scheduler.py",
        "0 if crowded and r.params.greedy else None)",
        "0 if crowded else None)",
        ("tests/runtime/test_speculative.py::test_greedy_rows_stop_drafting_in_crowded_steps",),
        "sampled rows stop drafting in crowded steps: their draft counts (and seeded tokens) depend on the batch",
    ),
    Mutant(
        "fp8-wide-steps-for-every-weight", "rlt_kernels/gemm.py",
        "if widened and accumulators == 1 and k <= FP8_WIDE_STEP_MAX_K:",
        "if widened:",
        ("tests/kernels/test_gemm.py::test_fp8_decode_tiles_at_model_shapes",),
        "FP8 SwiGLU and deep weights take the 256-element K step the H200 sweep measured as slower for them",
    ),
    Mutant(
        "tma-tile-without-the-split-plan", "rlt_kernels/gemm.py",
        "tiles = [LinearConfig(bm, bn, bk * 2 // elem, warps, stages, split_k=decode.split_k, tma=True,",
        "tiles = [LinearConfig(bm, bn, bk * 2 // elem, warps, stages, tma=True,",
        ("tests/kernels/test_gemm.py::test_tma_tiles_at_ouro_shapes",),
        "the TMA tiles of the middle and prefill rows reduce a split weight over all of K at once (other bits than decode)",
    ),
    Mutant(
        "w8a8-in-tile-rows-that-leave-sms-idle", "rlt_kernels/gemm.py",
        "return tiles[-1] if tiles and not must_fill else None",
        "return tiles[-1] if tiles else None",
        ("tests/kernels/test_w8a8.py::test_w8a8_middle_rows_of_down_add_their_ranges_in_the_tile[128-False]",),
        "W8A8 down at 128 rows adds its ranges in a tile of 64 programs instead of writing partials",
    ),
    Mutant(
        "in-tile-ranges-summed-as-one", "rlt_kernels/gemm.py",
        "if ((k0 + BLOCK_K) % k_range == 0) | (k0 + BLOCK_K >= k_hi):  # the range's last step",
        "if k0 + BLOCK_K >= k_hi:",
        ("tests/kernels/test_w8a8.py::test_w8a8_ranges_added_in_the_tile_keep_the_bits_of_the_partials",),
        "a tile adding a split weight's K ranges keeps one running sum over all of K (other bits than the partials)",
    ),
    Mutant(
        "replayed-draft-counts-ignored", "perf/conformance_case.py",
        "k = replay[i][0]",
        "k = k",
        ("tests/runtime/test_conformance.py::test_a_failed_crowd_runs_alone_with_its_draft_counts",),
        "a case rerun alone with a failed crowd's draft counts takes its own instead",
    ),
    Mutant(
        "transposed-tma-tile-left-transposed", "rlt_kernels/gemm.py",
        "return acc_g, acc_u",
        "return tl.trans(acc_g), tl.trans(acc_u)",
        ("tests/kernels/test_gemm.py::test_wide_decode_tile_by_tma",),
        "the 64-row decode tile fetched by TMA returns its product transposed (square tiles: no shape error)",
    ),
    Mutant(
        "narrow-decode-tile-by-tma", "rlt_kernels/gemm.py",
        "tma=tma and SKINNY_WIDE_TMA and block_m == BLOCK_M)",
        "tma=tma and SKINNY_WIDE_TMA)",
        ("tests/kernels/test_gemm.py::test_wide_decode_tile_by_tma",),
        "the 16-row decode tile takes TMA too, slower in the H200's decode chain at batches 1-16",
    ),
    Mutant(
        "decode-padding-rows-taken-as-live", "rlt_kernels/attention.py",
        "if (seq >= n_active) | (tl.load(qsl_ptr + seq) != token) | (tl.load(qsl_ptr + seq + 1) != token + 1):",
        "if (tl.load(qsl_ptr + seq) != token) | (tl.load(qsl_ptr + seq + 1) != token + 1):",
        ("tests/kernels/test_attention.py::test_decode_padding_rows_past_the_live_count_stay_untouched",),
        "a bucket's padding decode rows past the live count attend over stale lengths and write their outputs",
    ),
    Mutant(
        "fixed-depth-dense-kernels-read-the-count", "rlt_runtime/executor/model_runner.py",
        "batch = self._decode_batch(pos, slots, active, key_depth_reads=not fixed, padding_unread=fixed)",
        "batch = self._decode_batch(pos, slots, active, key_depth_reads=not fixed)",
        ("tests/runtime/test_fixed_depth_steps.py::test_fixed_depth_dense_kernels_take_no_live_count",),
        "fixed-depth decode passes read the live-row count before every linear and norm launch's loads",
    ),
    Mutant(
        "early-exit-dense-kernels-without-the-count", "rlt_runtime/executor/forward_batch.py",
        "return None if self.padding_unread else self.active",
        "return None",
        ("tests/runtime/test_fixed_depth_steps.py::test_fixed_depth_dense_kernels_take_no_live_count",),
        "passes whose rows may exit early compute every row of the bucket, left rows included",
    ),
    Mutant(
        "tma-tile-writes-past-the-active-count", "rlt_kernels/gemm.py",
        "io_mask = (rows[:, None] < live) & (cols[None, :] < n_out)",
        "io_mask = (rows[:, None] < m) & (cols[None, :] < n_out)",
        ("tests/kernels/test_gemm.py::test_linear_row_class_tiles",),
        "the TMA tile writes rows past the active count (a graph captured at a larger bucket overwrites them)",
    ),
    Mutant(
        "cache-slots-for-rows-past-the-active-count", "rlt_kernels/block_tables.py",
        "live = rows < row_limit(active_ptr, num_rows, HAS_ACTIVE)",
        "live = rows < num_rows",
        ("tests/kernels/test_block_tables.py::test_cache_slots_match_the_arithmetic[16-130]",),
        "padding rows past the live count get cache slots from their stale metadata",
    ),
    Mutant(
        "tma-launch-leaves-fma-contraction-to-triton", "rlt_kernels/gemm.py",
        "num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl, enable_fp_fusion=True,",
        "num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl,",
        ("tests/kernels/test_launch_options.py::test_every_launch_states_fma_contraction",),
        "the TMA linear launch leaves FMA contraction to Triton's default, which Triton 3.10 turns off (other bits)",
    ),
    Mutant(
        "remote-roles-unchecked", "rlt_runtime/engine/disaggregated.py",
        "_check_roles_agree(*workers)",
        "pass",
        ("tests/runtime/test_remote_roles.py::test_mismatched_engines_are_refused",),
        "a front end serves requests through engines started apart with different depths (wrong outputs)",
    ),
    Mutant(
        "attention-hints-unaligned-key-rows", "rlt_kernels/attention.py",
        "return all(s % 16 == 0 for s in k_cache.stride()[:3])",
        "return True",
        ("tests/kernels/test_sm90_codegen.py::test_alignment_hint_only_where_every_key_row_is_aligned",),
        "the attention kernels are told every key row is 16-element aligned when it is not (wrong vector loads on a GPU)",
    ),
    Mutant(
        "decode-range-program-takes-one-range", "rlt_kernels/attention.py",
        "c_step = tl.num_programs(2)",
        "c_step = n_ranges",
        ("tests/kernels/test_attention.py::test_decode_range_programs_keep_bits",),
        "a split decode launch with fewer range programs than key ranges computes only each program's first range",
    ),
    Mutant(
        "every-loop-writes-plane-zero", "rlt_runtime/executor/forward_batch.py",
        "slots = self._plane_slots()[spec.write_plane]",
        "slots = self._plane_slots()[0]",
        ("tests/runtime/test_engine_reference.py::test_ouro_layouts_and_exit_modes[ouro-0.55-last_exited]",),
        "the slot mappings of every plane, computed in one pass, hand every loop the first plane's slots",
    ),
    Mutant(
        "decode-heads-first-grid-read-tokens-first", "rlt_kernels/attention.py",
        "token_pid, kvh = tl.program_id(1), tl.program_id(0)",
        "token_pid, kvh = tl.program_id(0), tl.program_id(1)",
        ("tests/kernels/test_attention.py::test_decode_grid_order_keeps_bits",),
        "a heads-first decode grid read as tokens first: programs attend the wrong (token, KV head) rows",
    ),
    Mutant(
        "device-kernel-tests-take-gpu-tests", "tests/conftest.py",
        'chosen = [item for item in items if "device" in getattr(item, "fixturenames", ()) and "gpu" not in item.keywords]',
        'chosen = [item for item in items if "device" in getattr(item, "fixturenames", ())]',
        ("tests/test_device_kernel_tests.py::test_option_selects_the_device_tests_without_the_gpu_marker",),
        "perf/run_gpu.sh device-tests also runs the gpu-marked tests the GPU suite already runs",
    ),
    Mutant(
        "fused-rope-flushes-subnormals", "rlt_kernels/kv_cache.py",
        'return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,',
        'return tl.inline_asm_elementwise("mul.rn.ftz.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True,',
        ("tests/kernels/test_sm90_codegen.py::test_decode_attention_keeps_subnormals",),
        "the decode kernel's fused RoPE flushes subnormal products to zero (as libdevice's mul_rn does), "
        "unlike the RoPE kernel it must match",
    ),
    Mutant(
        "keyless-decode-row-unwritten", "rlt_kernels/attention.py",
        "if c_lo >= tl.maximum(n_ranges, 1):",
        "if c_lo >= n_ranges:",
        ("tests/kernels/test_attention.py::test_decode_ranges_merged_in_place",),
        "a split decode row that sees no key is left unwritten when ranges merge in place (no combine kernel zeroes it)",
    ),
    Mutant(
        "key-depths-never-recorded", "rlt_runtime/executor/model_runner.py",
        "if not self.layout.use_key_depth_reads:",
        "if True:",
        ("tests/runtime/test_engine_reference.py::test_ouro_layouts_and_exit_modes[ouro-0.55-last_exited]",),
        "tokens being computed never mark their key depth, so later loops read their K/V from plane 0",
    ),
    Mutant(
        "huginn-recompute-runs-past-its-depth", "rlt_runtime/models/huginn.py",
        "if batch.depth_limit is not None:",
        "if False:",
        ("tests/runtime/test_engine_reference.py::test_huginn_preemption_and_prefix_cache_match_reference",),
        "an output recomputed after a preemption keeps recurring past its recorded exit, so its coda K/V changes",
    ),
    Mutant(
        "prefill-never-launches-the-decode-arithmetic", "rlt_runtime/executor/model_runner.py",
        "generated = generated or in_prompt < n",
        "generated = generated",
        ("tests/runtime/test_preemption_outputs.py::test_prefill_launches_the_decode_arithmetic_only_for_recomputed_outputs",),
        "outputs recomputed after a preemption run the prompt arithmetic, so their bits differ from decode's",
    ),
    Mutant(
        "key-depths-unread-at-loop-1", "rlt_runtime/cache/layout.py",
        "use_key_depth=self.use_key_depth_reads and t > 0,",
        "use_key_depth=self.use_key_depth_reads and t > 1,",
        ("tests/runtime/test_engine_reference.py::test_ouro_layouts_and_exit_modes[ouro-0.55-last_exited]",),
        "loop 1 reads keys that left after loop 0 from its own plane, which they never wrote",
    ),
    Mutant(
        "key-depths-unread-in-early-exit-steps", "rlt_runtime/executor/model_runner.py",
        "batch = self._decode_batch(rs.pos, rs.slots, rs.active, key_depth_reads=not fixed,",
        "batch = self._decode_batch(rs.pos, rs.slots, rs.active, key_depth_reads=False,",
        ("tests/runtime/test_engine_reference.py::test_ouro_layouts_and_exit_modes[ouro-0.55-last_exited]",),
        "decode steps with rows that may exit early read every key from the query's own plane",
    ),
    Mutant(
        "key-depths-read-at-loop-0", "rlt_runtime/cache/layout.py",
        "use_key_depth=self.use_key_depth_reads and t > 0,",
        "use_key_depth=self.use_key_depth_reads,",
        ("tests/runtime/test_key_depth_reads.py",),
        "loop 0 reads the key-depth table although no key can have left before it (work only)",
    ),
    Mutant(
        "tile-sums-all-k-ranges-in-one-accumulator", "rlt_kernels/gemm.py",
        "if ((k0 + BLOCK_K) % k_range == 0) | (k0 + BLOCK_K >= k_hi):  # the range's last step",
        "if k0 + BLOCK_K >= k_hi:",
        ("tests/kernels/test_gemm.py::test_split_ranges_add_in_range_order",),
        "a TMA tile of a split weight runs one sum over all of K (other bits than the decode launches)",
    ),
    Mutant(
        "speculative-rounds-fixed-with-early-exit-rows", "rlt_runtime/executor/speculative.py",
        "fixed = self.runner.takes_fixed_path(requests)",
        "fixed = self.runner.fixed_steps",
        ("tests/runtime/test_speculative.py::test_greedy_speculation_is_bitwise_identical",
         "tests/runtime/test_key_depth_reads.py"),
        "drafts and verification of requests with an exit threshold skip the exit rule (full depth)",
    ),
    Mutant(
        "speculative-rounds-never-fixed", "rlt_runtime/executor/speculative.py",
        "fixed = self.runner.takes_fixed_path(requests)",
        "fixed = False",
        ("tests/runtime/test_key_depth_reads.py",),
        "rounds of requests that never exit early run the exit rule and read key depths (work only)",
    ),
    Mutant(
        "greedy-round-count-is-the-largest", "rlt_runtime/engine/greedy_rounds.py",
        "(fixed_tokens + sum(e[min(c, len(e) - 1)] for e in expected)) / self.cost(rows, c), -c))",
        "c, -c))",
        ("tests/runtime/test_greedy_rounds.py",),
        "greedy rows all draft the most any can commit, whether or not the drafts pay",
    ),
    Mutant(
        "greedy-round-costs-never-measured", "rlt_runtime/engine/greedy_rounds.py",
        "measured = self.costs.relative(rows, k) if k else 1.0",
        "measured = None if k else 1.0",
        ("tests/runtime/test_greedy_rounds.py",),
        "rounds are priced by the static 1 + k d / D at every batch: larger batches speculate at a loss",
    ),
    Mutant(
        "greedy-round-costs-take-the-last-sample", "rlt_runtime/engine/greedy_rounds.py",
        "return None if plain is None or ms is None else min(ms) / min(plain)",
        "return None if plain is None or ms is None else ms[-1] / plain[-1]",
        ("tests/runtime/test_greedy_rounds.py",),
        "a stalled step's device time prices its round count until the count runs again",
    ),
    Mutant(
        "greedy-rounds-never-explore-with-fresh-requests", "rlt_runtime/engine/greedy_rounds.py",
        "if k < top and 2 * sum(e == k + 1 for e in exploring) >= len(expected):",
        "if False:",
        ("tests/runtime/test_greedy_rounds.py::test_fresh_requests_explore_together_and_a_lone_one_waits",),
        "a batch of fresh requests waits for the backed-off probe schedule before drafting at all",
    ),
    Mutant(
        "linear-tiles-ignore-the-device-shared-memory", "rlt_kernels/gemm.py",
        "budget = min(SMEM_BUDGET_BYTES, smem)",
        "budget = SMEM_BUDGET_BYTES",
        ("tests/kernels/test_small_smem_gpus.py::test_tiles_fit_a_99_kib_gpu_and_keep_their_k_plan",),
        "decode and prefill pipelines sized for the H200 fail to launch on 99 KiB GPUs (RTX 4090, L40S)",
    ),
    Mutant(
        "skinny-tiles-ignore-the-device-shared-memory", "rlt_kernels/gemm.py",
        "stages = max(2, min(SKINNY_MAX_STAGES, min(in_flight, smem) // stage_bytes))",
        "stages = max(2, min(SKINNY_MAX_STAGES, in_flight // stage_bytes))",
        ("tests/kernels/test_small_smem_gpus.py::test_tiles_fit_a_99_kib_gpu_and_keep_their_k_plan",),
        "the transposed decode tiles keep 120-160 KiB in flight on 99 KiB GPUs: every decode launch fails there",
    ),
    Mutant(
        "greedy-rounds-follow-the-luckiest-row", "rlt_runtime/engine/scheduler.py",
        "if self.greedy_rounds is not None:",
        "if False:",
        ("tests/runtime/test_speculative.py::test_greedy_rows_take_the_count_that_pays_for_the_round",),
        "the adaptive policy's greedy rows take the round's largest own choice (a batch's noisy estimates, maxed)",
    ),
    Mutant(
        "draft-policy-probes-only-from-zero", "rlt_runtime/engine/draft_policy.py",
        "if k < cap:  # probe position k + 1 when no round took it for wait_k rounds (round m - 1 counts)",
        "if k == 0 < cap:",
        ("tests/runtime/test_draft_policy.py::test_adaptive_measures_deeper_positions_again",),
        "a request whose deep draft positions were judged too early stays below its best count for good",
    ),
    Mutant(
        "fused-rope-split-writer-misses-its-range", "rlt_kernels/attention.py",
        "if c_lo == (tl.maximum(n_ranges, 1) - 1) % c_step:  # this program's ranges hold the row's own key",
        "if c_lo == tl.maximum(n_ranges, 1) % c_step:",
        ("tests/kernels/test_rope_paged_attention.py::test_split_rows_write_their_own_key_once[2]",),
        "in a split decode launch the range program that writes a row's own key is not the one that reads it",
    ),
    Mutant(
        "fused-rope-next-range-keys-stale", "rlt_kernels/attention.py",
        "next_start = range_start + c_step * split_size",
        "next_start = range_start",
        ("tests/kernels/test_rope_paged_attention.py::test_split_rows_write_their_own_key_once[1]",),
        "a fused decode program that takes several key ranges reads every later range through the first's block ids",
    ),
    Mutant(
        "fp8-grouped-decode-one-warp", "rlt_kernels/attention.py",
        "return DECODE_WARPS_FP8 if group_heads == 1 else DECODE_WARPS_FP8_GROUPED",
        "return DECODE_WARPS_FP8",
        ("tests/kernels/test_fp8_kv.py::test_fp8_decode_warps_are_fixed_by_the_cache_and_group",),
        "GQA FP8 decode programs run one warp too (GP accumulators a lane in one warp's registers)",
    ),
    Mutant(
        "bench-engine-call-writes-another-planes-slot", "perf/bench_decode_attention.py",
        'block = c["tables"][PLANES - 1, :, pos // BLOCK].long()',
        'block = c["tables"][0, :, pos // BLOCK].long()',
        ("tests/runtime/test_bench_decode_attention.py::test_engine_call_rotates_writes_and_attends_like_the_two_launches[False]",),
        "the decode-attention benchmark's engine call writes each new token into a slot its query's plane does not read last",
    ),
    Mutant(
        "fp8-pair-second-tile-masked-as-first", "rlt_kernels/attention.py",
        "s_b = _lane_scores(q, k_b, start + BLOCK_N, range_end, offs_n, WIDEN_INLINE)",
        "s_b = _lane_scores(q, k_b, start, range_end, offs_n, WIDEN_INLINE)",
        ("tests/kernels/test_fp8_kv.py::test_decode_reads_no_fp8_byte_past_its_keys",),
        "the second tile of an FP8 pair keeps the scores of keys past the row's last key",
    ),
    Mutant(
        "fp8-second-pair-at-first-pair-keys", "rlt_kernels/attention.py",
        "m_i, l_i, acc = _lane_update_pair(q, k_c, v_c, k_d, v_d, start + 2 * BLOCK_N, range_end, offs_n,",
        "m_i, l_i, acc = _lane_update_pair(q, k_c, v_c, k_d, v_d, start, range_end, offs_n,",
        ("tests/kernels/test_fp8_kv.py::test_fp8_decode_bits_do_not_depend_on_block_size_or_tiles_in_flight",),
        "with four FP8 tiles in flight the second pair is masked as the first: keys past the end are applied",
    ),
    Mutant(
        "decode-tile-base-ignores-offset-in-block", "rlt_kernels/attention.py",
        "base = blk_own * stride_cb + (start.to(tl.uint32) % BLOCK_SIZE).to(tl.int64) * stride_co",
        "base = blk_own * stride_cb",
        ("tests/kernels/test_fp8_kv.py::test_fp8_decode_bits_do_not_depend_on_block_size_or_tiles_in_flight",),
        "a decode key tile in the second half of a 32-key block reads the block's first 16 keys",
    ),
    Mutant(
        "fused-rope-q-unrotated", "rlt_kernels/attention.py",
        "q = tl.where(io_mask, q, 0.0)",
        "q = tl.load(q_ptr + token * stride_qt + head[:, None] * stride_qh + offs_d[None, :], mask=io_mask, other=0.0)",
        ("tests/kernels/test_rope_paged_attention.py::test_fused_pass_gives_the_two_kernels_bits[bf16 neox MHA]",),
        "the fused decode launch attends with the unrotated q",
    ),
    Mutant(
        "fused-rope-v-not-written", "rlt_kernels/attention.py",
        "tl.store(v_cache_ptr + dst, v, mask=mask)",
        "tl.store(v_cache_ptr + dst, v * 0, mask=mask)",
        ("tests/kernels/test_rope_paged_attention.py::test_fused_pass_gives_the_two_kernels_bits[bf16 neox MHA]",),
        "the fused decode launch writes the token's own value row wrongly",
    ),
    Mutant(
        "pdl-off-on-hopper", "rlt_kernels/_pdl.py",
        "return torch.cuda.get_device_capability(index)[0] >= 9",
        "return torch.cuda.get_device_capability(index)[0] > 9",
        ("tests/kernels/test_pdl.py::test_every_launch_on_hopper_is_dependent",),
        "Hopper launches in plain stream order: every kernel's launch waits for the one before to end",
    ),
    Mutant(
        "quantize-rows-load-before-wait", "rlt_kernels/fp8_rows.py",
        "wait_for_inputs(PDL)",
        "first = tl.load(x_ptr); wait_for_inputs(PDL)",
        ("tests/kernels/test_pdl.py::test_kernels_wait_before_any_memory_access",),
        "a dependent launch reads its input before the kernel writing it has finished",
    ),
    Mutant(
        "fp8-row-scale-one-power-too-small", "rlt_kernels/fp8_rows.py",
        "biased = tl.where(amax > 0, tl.maximum(exponent - 7, 1), 127)",
        "biased = tl.where(amax > 0, tl.maximum(exponent - 8, 1), 127)",
        ("tests/kernels/test_w8a8.py::test_quantize_rows_matches_torch_bit_for_bit",),
        "FP8 rows take half their scale: a row's largest values pass 448 and saturate",
    ),
    Mutant(
        "fp8-rows-lose-the-sign-of-zero", "rlt_kernels/fp8_rows.py",
        "q = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)",
        "q = tl.where(v < 0, -rounded, rounded)",
        ("tests/kernels/test_w8a8.py::test_quantize_rows_matches_torch_bit_for_bit",),
        "negative values that round to zero are stored as +0 (on the GPU the negation compiles to 0 - x)",
    ),
    Mutant(
        "w8a8-epilogue-drops-the-row-scale", "rlt_kernels/gemm.py",
        "acc_g = acc_g * row_scale",
        "acc_g = acc_g",
        ("tests/kernels/test_w8a8.py::test_w8a8_linear_matches_fp64",),
        "W8A8 outputs are not multiplied by their row's scale",
    ),
    Mutant(
        "split-partials-drop-the-row-scale", "rlt_kernels/norms.py",
        "acc = acc * tl.load(row_scale_ptr + row)",
        "acc = acc",
        ("tests/kernels/test_w8a8.py::test_norms_write_fp8_rows_as_quantize_rows_would[4160-huginn]",),
        "the residual norm adds a split W8A8 linear's partials without the rows' scales",
    ),
    Mutant(
        "ouro-norms-never-write-fp8-rows", "rlt_runtime/models/ouro.py",
        'if self.quantization != "w8a8_fp8":',
        "if True:",
        ("tests/runtime/test_fp8_engine.py::test_w8a8_norms_write_the_rows_the_layers_read",),
        "Ouro's norms write 16-bit rows under W8A8 and every layer quantizes its own input",
    ),
    Mutant(
        "w8a8-layers-take-16-bit-rows", "rlt_runtime/models/fp8_weights.py",
        "if weight.w8a8 and not isinstance(x, Fp8Rows):",
        "if False:",
        ("tests/runtime/test_fp8_engine.py::test_w8a8_norms_write_the_rows_the_layers_read",),
        "a W8A8 layer given 16-bit rows multiplies them unquantized (o and down run as W8A16)",
    ),
    Mutant(
        "named-tool-arguments-unconstrained", "rlt_runtime/entrypoints/server/tools.py",
        'return {"json": fn.get("parameters") or ANY_OBJECT}',
        "return None",
        ("tests/server/test_tools.py::test_named_tool_choice_answers_with_that_call",),
        "a named tool_choice lets the model write anything as the function's arguments",
    ),
    Mutant(
        "parallel-tool-calls-false-ignored", "rlt_runtime/entrypoints/server/tools.py",
        'return {"json": array if parallel else dict(array, maxItems=1)}',
        'return {"json": array}',
        ("tests/server/test_tools.py::test_parallel_tool_calls_false_makes_one_required_call",),
        "parallel_tool_calls false still lets a required answer make several calls",
    ),
    Mutant(
        "hermes-content-keeps-the-calls", "rlt_runtime/entrypoints/server/tools.py",
        "return (text, None) if at < 0 else (text[:at], self.calls(text[at:]))",
        "return (text, None) if at < 0 else (text, self.calls(text[at:]))",
        ("tests/server/test_tools.py::test_hermes_parser",),
        "an auto answer's content still holds the tool-call markup it was parsed from",
    ),
    Mutant(
        "streamed-auto-content-leaks-a-marker", "rlt_runtime/entrypoints/server/app.py",
        "ready = max(self.tool_parser.streamable(st.tool_text), st.tool_sent)",
        "ready = len(st.tool_text)",
        ("tests/server/test_tools.py::test_auto_tool_choice_reads_the_calls_the_model_writes",),
        "streamed auto content sends the start of a tool call as text before the call is parsed",
    ),
    Mutant(
        "required-calls-finish-with-stop", "rlt_runtime/entrypoints/server/app.py",
        'finish = "tool_calls"  # vLLM\'s reason ("stop" after a named function\'s call)',
        "pass",
        ("tests/server/test_tools.py::test_required_tool_choice_answers_with_calls_of_the_given_functions",),
        "an answer of required calls reports finish_reason stop instead of tool_calls",
    ),
    Mutant(
        "tool-results-lose-their-call-id", "rlt_runtime/chat_messages.py",
        'message["tool_call_id"] = tool_call_id',
        "pass",
        ("tests/server/test_tools.py::test_tools_earlier_calls_and_results_reach_the_template",),
        "a tool message reaches the chat template without the id of the call it answers",
    ),
    Mutant(
        "llama3-json-reads-only-the-first-call", "rlt_runtime/entrypoints/server/tools.py",
        "at += 1",
        "return calls",
        ("tests/server/test_tools.py::test_llama3_json_parser",),
        "llama3_json drops the calls after the first ';' and answers with the first one only",
    ),
    Mutant(
        "pythonic-accepts-any-expression", "rlt_runtime/entrypoints/server/tools.py",
        'raise ValueError("a pythonic tool call\'s arguments must be literals")',
        "return ast.unparse(node)",
        ("tests/server/test_tools.py::test_pythonic_parser_reads_only_literals",),
        "a pythonic call whose argument is a name, a call or an import passes it on as its source text",
    ),
    Mutant(
        "mistral-reads-only-the-first-call", "rlt_runtime/entrypoints/server/tools.py",
        "return [_json_call(call, mistral_call_id) for call in written]",
        "return [_json_call(written[0], mistral_call_id)]",
        ("tests/server/test_tools.py::test_mistral_parser",),
        "a mistral answer's array of several calls comes back as its first call only",
    ),
    Mutant(
        "responses-function-calls-dropped", "rlt_runtime/entrypoints/server/app.py",
        "items += [self.build.function_call_item(call) for call in calls or []]",
        "items += []",
        ("tests/server/test_tools.py::test_responses_named_function_call",),
        "a response answered with function calls has no function_call items",
    ),
    Mutant(
        "responses-input-function-calls-dropped", "rlt_runtime/entrypoints/server/responses.py",
        'raw[-1][0].setdefault("tool_calls", []).append(call)',
        'raw[-1][0].setdefault("tool_calls", [])',
        ("tests/server/test_tools.py::test_responses_function_calls_and_outputs_come_back_as_input",),
        "an earlier response's function_call items never reach the chat template",
    ),
    Mutant(
        "structured-output-forced-inside-the-reasoning", "rlt_runtime/entrypoints/server/app.py",
        "params = dataclasses.replace(params, guided=dataclasses.replace(params.guided, after=THINK_END))",
        "pass",
        ("tests/server/test_chat_templates.py::test_structured_output_starts_after_the_reasoning",),
        "a thinking model's constrained answer is forced from its first token, inside the reasoning",
    ),
    Mutant(
        "guided-after-ignored", "rlt_runtime/engine/grammar.py",
        "if after is not None:",
        "if False:",
        ("tests/runtime/test_guided_decoding.py::test_after_lets_any_text_come_first",),
        "a constraint with `after` applies from the first token instead of after the marker",
    ),
    Mutant(
        "bounded-json-strings-take-control-characters", "rlt_runtime/engine/grammar.py",
        "if BOUNDED_STRING_CHAR in ebnf else grammar",
        "if False else grammar",
        ("tests/runtime/test_guided_decoding.py::test_length_bounded_strings_hold_no_raw_control_characters",),
        "JSON strings with minLength/maxLength may hold raw control characters, which strict JSON parsers refuse",
    ),
    Mutant(
        "allowed-token-ids-need-other-processing", "rlt_runtime/sampling_params.py",
        "or self.min_tokens or self.bad_words or self.allowed_token_ids)",
        "or self.min_tokens or self.bad_words)",
        ("tests/runtime/test_logit_processing.py::test_greedy_decoding_matches_the_reference",),
        "allowed_token_ids alone runs the step without processing, so its mask is never applied",
    ),
    Mutant(
        "allowed-rows-not-written-at-admission", "rlt_runtime/executor/token_mask.py",
        "restricted = [a for a in admitted if a.params.allowed_token_ids is not None and a.slot not in guided]",
        "restricted = []",
        ("tests/runtime/test_guided_decoding.py::test_slot_rows_follow_their_slots",
         "tests/runtime/test_logit_processing.py::test_greedy_decoding_matches_the_reference"),
        "a request's allowed_token_ids never reach its slot's mask row (which keeps the previous request's)",
    ),
    Mutant(
        "allowed-ids-lost-under-a-grammar", "rlt_runtime/engine/llm_engine.py",
        "restrict(masks[i:i + 1], r.allowed_words)",
        "None",
        ("tests/runtime/test_guided_decoding.py::test_allowed_token_ids_narrow_a_grammar",),
        "a guided request's grammar masks replace its allowed_token_ids instead of intersecting them",
    ),
    Mutant(
        "allowed-ids-lost-in-draft-checks", "rlt_runtime/engine/llm_engine.py",
        "restrict(masks, live[key].allowed_words)",
        "None",
        ("tests/runtime/test_guided_decoding.py::test_allowed_token_ids_narrow_a_grammar",),
        "a guided request's drafts are verified against its grammar alone, so a draft outside allowed_token_ids "
        "can be accepted",
    ),
    Mutant(
        "truncation-keeps-the-wrong-end", "rlt_runtime/sampling_params.py",
        'return ids[-keep:] if self.truncation_side == "left" else ids[:keep]',
        'return ids[:keep] if self.truncation_side == "left" else ids[-keep:]',
        ("tests/runtime/test_llm_api.py::test_truncate_prompt_tokens_keeps_one_end_of_the_prompt",
         "tests/server/test_vllm_request_extensions.py::test_truncated_prompts_run_the_tokens_kept"),
        "truncate_prompt_tokens keeps the first tokens where it should keep the last (and the reverse)",
    ),
    Mutant(
        "server-truncates-after-the-context-check", "rlt_runtime/entrypoints/server/app.py",
        "kept = params.truncated(ids, engine.max_model_len)",
        "kept = ids",
        ("tests/server/test_vllm_request_extensions.py::test_truncation_applies_before_the_context_check",),
        "a prompt longer than the context is refused although truncate_prompt_tokens would shorten it",
    ),
    Mutant(
        "request-chat-template-trusted-without-the-flag", "rlt_runtime/entrypoints/server/app.py",
        "if not self.config.trust_request_chat_template:",
        "if False:",
        ("tests/server/test_chat_templates.py::test_a_requests_own_template_needs_trust",),
        "any request may run its own Jinja template without --trust-request-chat-template",
    ),
    Mutant(
        "template-documents-dropped", "rlt_runtime/models/tokenizer.py",
        "documents=documents or None, **kwargs)",
        "**kwargs)",
        ("tests/server/test_chat_templates.py::test_a_requests_own_template_needs_trust",),
        "a request's documents never reach the chat template",
    ),
    Mutant(
        "tokens-as-ids-ignored", "rlt_runtime/entrypoints/server/app.py",
        'return (f"token_id:{token_id}", width) if self.tokens_as_ids else (s, width)',
        "return (s, width)",
        ("tests/server/test_vllm_request_extensions.py::test_return_tokens_as_token_ids",),
        "return_tokens_as_token_ids leaves the logprobs' tokens as text",
    ),
    Mutant(
        "stored-chain-drops-earlier-turns", "rlt_runtime/entrypoints/server/response_store.py",
        'response_id = entry.response.get("previous_response_id")',
        "response_id = None",
        ("tests/server/test_stored_responses.py::test_previous_response_id_continues_the_conversation",),
        "previous_response_id continues only the last response, not the turns before it",
    ),
    Mutant(
        "store-false-stored-anyway", "rlt_runtime/entrypoints/server/app.py",
        "self.build = Responses(body, self.model, stored=body.store is not False and serving.stored_responses.enabled)",
        "self.build = Responses(body, self.model, stored=serving.stored_responses.enabled)",
        ("tests/server/test_stored_responses.py::test_store_false_and_streamed_responses",),
        "a response created with store: false is stored",
    ),
    Mutant(
        "response-store-unbounded", "rlt_runtime/entrypoints/server/response_store.py",
        "while len(self._entries) > self.max_responses or self._bytes > self.max_bytes:",
        "while False:",
        ("tests/server/test_stored_responses.py::test_the_store_bounds_count_and_size_and_walks_chains",
         "tests/server/test_stored_responses.py::test_the_store_keeps_the_most_recent"),
        "the response store grows without bound",
    ),
    Mutant(
        "streamed-responses-not-stored", "rlt_runtime/entrypoints/server/app.py",
        "yield sse(b.event(kind, response=self.finished(items, status, usage)))",
        "yield sse(b.event(kind, response=b.response(items, status, usage)))",
        ("tests/server/test_stored_responses.py::test_store_false_and_streamed_responses",),
        "a streamed response is never stored, so previous_response_id cannot continue it",
    ),
    Mutant(
        "updated-weights-not-written", "rlt_runtime/models/weight_update.py",
        "part.copy_(src)",
        "None",
        ("tests/runtime/test_weight_update.py::test_new_weights_give_what_an_engine_built_with_them_gives",),
        "update_weights checks the new weights but never writes them into the live model",
    ),
    Mutant(
        "fp8-scales-by-a-reciprocal", "rlt_kernels/fp8.py",
        "scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))",
        "scale = torch.where(amax > 0, amax * (1.0 / FP8_MAX), torch.ones_like(amax))",
        ("tests/kernels/test_fp8_linear.py::test_quantize_weight_per_channel",),
        "FP8 weight scales multiply by the reciprocal of 448 (as CUDA does for a scalar divisor): not amax / 448",
    ),
    Mutant(
        "updated-k-rows-over-q", "rlt_runtime/models/ouro.py",
        "p + \"self_attn.k_proj.weight\": (Target(layer.wqkv, rows=keep.kv, at=q),),",
        "p + \"self_attn.k_proj.weight\": (Target(layer.wqkv, rows=keep.kv, at=0),),",
        ("tests/runtime/test_weight_update.py::test_any_part_written_gives_the_model_its_load_builds",),
        "a new k_proj is written over the first rows of the fused q/k/v weight instead of after q's",
    ),
    Mutant(
        "updated-fp8-columns-scaled-by-the-shard", "rlt_runtime/models/weight_update.py",
        "data, scale = quantize_weight_fp8(t)  # whole rows: a row's scale is its whole row's",
        "data, scale = quantize_weight_fp8(t[:, cols]); cols = slice(None)",
        ("tests/runtime/test_weight_update.py::test_any_part_written_gives_the_model_its_load_builds",),
        "a tensor-parallel rank's FP8 o/down columns take scales from its shard of each row, not the whole row a load uses",
    ),
    Mutant(
        "updated-huginn-k-bias-from-q", "rlt_runtime/models/huginn.py",
        "Target(b.k_bias, rows=keep.kv_heads, pick=lambda bias: bias[1, 0, : cfg.num_key_value_heads]))",
        "Target(b.k_bias, rows=keep.kv_heads, pick=lambda bias: bias[0, 0, : cfg.num_key_value_heads]))",
        ("tests/runtime/test_weight_update.py::test_any_part_written_gives_the_model_its_load_builds",),
        "a new Huginn q/k bias writes its q half into the k bias",
    ),
    Mutant(
        "update-takes-a-tensor-twice", "rlt_runtime/models/weight_update.py",
        "if name in given:",
        "if False:",
        ("tests/runtime/test_weight_update.py::test_refused_sets_change_nothing",),
        "a set naming one tensor twice is written (the last one winning) instead of refused",
    ),
    Mutant(
        "update-keeps-the-prefix-cache", "rlt_runtime/engine/llm_engine.py",
        "self.reset_prefix_cache()  # (its K/V came from the old weights)",
        "None",
        ("tests/runtime/test_weight_update.py::test_the_prefix_cache_is_reset",),
        "after new weights the prefix cache still serves K/V the old weights computed",
    ),
    Mutant(
        "weight-update-skips-the-rank-shard", "rlt_runtime/models/ouro.py",
        "p + \"mlp.gate_proj.weight\": (Target(layer.w_gate_up, rows=keep.mlp),),",
        "p + \"mlp.gate_proj.weight\": (Target(layer.w_gate_up, rows=(0, keep.mlp[1] - keep.mlp[0])),),",
        ("tests/runtime/test_weight_update.py::test_tensor_parallel_ranks_take_their_shards",),
        "every tensor-parallel rank takes rank 0's rows of a new gate_proj",
    ),
    Mutant(
        "prefix-reset-leaves-blocks-hashed", "rlt_runtime/cache/block_pool.py",
        "self._block_hash.clear()",
        "None",
        ("tests/runtime/test_weight_update.py::test_reset_drops_idle_entries_and_frees_referenced_ones_on_release",),
        "blocks still in use when the prefix cache is reset keep their hashes and never return to the free list",
    ),
    Mutant(
        "sleep-level-1-keeps-no-weights", "rlt_runtime/executor/worker.py",
        "self._asleep = {\"weights\": release(weight_tensors(self.model), keep=level == 1),",
        "self._asleep = {\"weights\": release(weight_tensors(self.model), keep=False),",
        ("tests/runtime/test_sleep_mode.py::test_level_1_gives_the_memory_back_and_wakes_to_the_same_outputs",),
        "sleep level 1 discards the weights instead of keeping them in host memory",
    ),
    Mutant(
        "sleep-gives-no-memory-back", "rlt_runtime/executor/sleep.py",
        "storage.resize_(0)",
        "None",
        ("tests/runtime/test_sleep_mode.py::test_level_1_gives_the_memory_back_and_wakes_to_the_same_outputs",),
        "sleep copies the weights out but keeps their device memory",
    ),
    Mutant(
        "profile-window-records-without-start", "rlt_runtime/engine/llm_engine.py",
        "if not self.cfg.profile_dir or not count or self._profile_manual:",
        "if not self.cfg.profile_dir or self._profile_manual:",
        ("tests/runtime/test_llm_api.py::test_start_and_stop_profile_write_a_trace_of_what_ran_between",),
        "profile_steps with 0 steps still records an automatic trace from its first step",
    ),
    Mutant(
        "request-id-header-ignores-the-requests-own", "rlt_runtime/entrypoints/server/app.py",
        "request_id = (_header(scope, b\"x-request-id\")[:128] or uuid.uuid4().hex).encode(\"latin-1\")",
        "request_id = uuid.uuid4().hex.encode(\"latin-1\")",
        ("tests/server/test_vllm_server_flags.py::test_request_id_headers",),
        "X-Request-Id answers with a new id although the request sent its own",
    ),
    Mutant(
        "server-ignores-generation-defaults", "rlt_runtime/entrypoints/server/protocol.py",
        "return defaults.get(name, neutral) if value is None else value",
        "return neutral if value is None else value",
        ("tests/server/test_generation_defaults.py::test_server_requests_take_the_defaults_for_what_they_leave_out",),
        "a server request that leaves out temperature samples at 1.0 although the model's generation_config.json says 0",
    ),
    Mutant(
        "generation-defaults-override-given-values", "rlt_runtime/entrypoints/server/protocol.py",
        "return defaults.get(name, neutral) if value is None else value",
        "return defaults.get(name, neutral if value is None else value)",
        ("tests/server/test_generation_defaults.py::test_server_requests_take_the_defaults_for_what_they_leave_out",),
        "the model's defaults replace values the request gave",
    ),
    Mutant(
        "invocations-route-chat-as-completions", "rlt_runtime/entrypoints/server/app.py",
        "if isinstance(body, dict) and \"messages\" in body:",
        "if False:",
        ("tests/server/test_invocations.py::test_invocations_answer_as_the_endpoint_their_body_is_for",),
        "an /invocations chat body is refused instead of answered as a chat completion",
    ),
    Mutant(
        "only-the-first-served-name-answers", "rlt_runtime/entrypoints/server/app.py",
        "if name is not None and name not in self.model_names():",
        "if name is not None and name != self.model_name():",
        ("tests/server/test_served_model_names.py::test_every_served_name_is_a_card_and_answers_as_the_first",),
        "a request naming the second --served-model-name gets a 404",
    ),
    Mutant(
        "sleep-keeps-the-staged-step-inputs", "rlt_runtime/executor/model_runner.py",
        "staging.dev.zero_()",
        "None",
        ("tests/runtime/test_sleep_mode.py::test_level_1_gives_the_memory_back_and_wakes_to_the_same_outputs",),
        "graphs captured at wake-up run on the last step's staged rows (on the GPU: indices past a smaller bucket)",
    ),
    Mutant(
        "sleep-keeps-the-prefix-cache", "rlt_runtime/engine/llm_engine.py",
        "self.reset_prefix_cache()  # (its K/V comes back as zeros)",
        "None",
        ("tests/runtime/test_sleep_mode.py::test_the_prefix_cache_is_reset_by_sleep",),
        "after sleep the prefix cache serves blocks whose K/V came back as zeros",
    ),
    Mutant(
        "asleep-engine-takes-requests", "rlt_runtime/engine/llm_engine.py",
        "raise RequestError(f\"the engine is asleep ({', '.join(self._asleep)} given back): call wake_up() first\")",
        "pass",
        ("tests/runtime/test_sleep_mode.py::test_level_2_then_new_weights_in_parts",),
        "a request is admitted while the KV cache it would write has no memory",
    ),
    Mutant(
        "update-weights-into-slept-weights", "rlt_runtime/engine/llm_engine.py",
        "raise RequestError(\"update_weights needs the weights awake: call wake_up(tags=['weights']) first\")",
        "pass",
        ("tests/runtime/test_sleep_mode.py::test_level_2_then_new_weights_in_parts",),
        "update_weights writes into weights whose storage sleep gave back",
    ),
    Mutant(
        "asleep-server-takes-requests", "rlt_runtime/entrypoints/server/worker.py",
        "self.asleep = True",
        "self.asleep = False",
        ("tests/server/test_sleep_endpoints.py::test_asleep_requests_get_503_and_woken_answers_match_offline",),
        "the server admits requests while the engine is asleep (they fail as 400s instead of 503 not_ready)",
    ),
    Mutant(
        "beams-ending-in-eos-stay-live", "rlt_runtime/beam_search.py",
        "if token in self.eos and not self.params.ignore_eos:",
        "if False:",
        ("tests/runtime/test_beam_search.py::test_rounds_keep_the_best_beams_and_complete_end_of_sequence_ones",),
        "a beam that writes the end-of-sequence token goes on instead of completing",
    ),
    Mutant(
        "beam-length-penalty-ignored", "rlt_runtime/beam_search.py",
        "return beam.cum_logprob / max(length, 1) ** self.params.length_penalty",
        "return beam.cum_logprob",
        ("tests/runtime/test_beam_search.py::test_the_length_penalty_decides_between_short_and_long",),
        "beams are ranked by their summed log-probability whatever length_penalty says",
    ),
    Mutant(
        "beam-width-unbounded", "rlt_runtime/beam_search.py",
        "elif len(live) < self.params.beam_width:",
        "else:",
        ("tests/runtime/test_beam_search.py::test_rounds_keep_the_best_beams_and_complete_end_of_sequence_ones",
         "tests/runtime/test_beam_search.py::test_llm_beam_search_matches_a_reference_search"),
        "every candidate stays a live beam, so the search keeps more than beam_width beams",
    ),
    Mutant(
        "server-ignores-use-beam-search", "rlt_runtime/entrypoints/server/protocol.py",
        "if not self.use_beam_search:",
        "if True:",
        ("tests/server/test_vllm_request_extensions.py::test_beam_search_answers_with_the_offline_searchs_beams",),
        "use_beam_search is accepted and the request is sampled instead",
    ),
    Mutant(
        "required-call-escapes-ignored", "rlt_runtime/entrypoints/server/tools.py",
        'elif ch == "\\\\":',
        "elif False:",
        ("tests/server/test_tools.py::test_required_calls_stream_their_arguments_as_written",),
        "an escaped quote inside a required call's string argument ends the string, so the arguments are cut",
    ),
    Mutant(
        "required-calls-stream-whole", "rlt_runtime/entrypoints/server/app.py",
        "delta.tool_calls = st.required.feed(text) or None",
        "st.required.feed(text)",
        ("tests/server/test_tools.py::test_streamed_tool_calls_add_up_to_the_whole_answer",),
        "a streamed required answer sends no tool-call deltas",
    ),
    Mutant(
        "mistral-calls-take-generic-ids", "rlt_runtime/entrypoints/server/tools.py",
        "return [_json_call(call, mistral_call_id) for call in written]",
        "return [_json_call(call) for call in written]",
        ("tests/server/test_tools.py::test_mistral_parser",),
        "mistral calls get ids Mistral's chat templates refuse when the calls come back",
    ),
    Mutant(
        "repetition-detection-ignored", "rlt_runtime/engine/llm_engine.py",
        "elif p.repetition_detection is not None and p.repetition_detection.repeats(req.output_token_ids):",
        "elif False:",
        ("tests/runtime/test_repetition_detection.py::test_engines_stop_at_the_first_repetition",),
        "repetition_detection is accepted and never stops a request",
    ),
    Mutant(
        "repetition-pattern-sizes-short-by-one", "rlt_runtime/sampling_params.py",
        "for size in range(max(self.min_pattern_size, 1), self.max_pattern_size + 1):",
        "for size in range(max(self.min_pattern_size, 1), self.max_pattern_size):",
        ("tests/runtime/test_repetition_detection.py::test_the_rule",),
        "patterns of max_pattern_size tokens are never checked",
    ),
    Mutant(
        "stop-reason-never-reported", "rlt_runtime/entrypoints/server/app.py",
        "return c.stop_reason",
        "return None",
        ("tests/server/test_vllm_request_extensions.py::test_choices_carry_vllms_stop_reason",),
        "choices report no stop_reason, whatever stop string or stop token ended them",
    ),
    Mutant(
        "conformance-crowd-keeps-old-weights", "perf/conformance_case.py",
        "take_new_weights(llm, case, work[0])",
        "None",
        ("tests/runtime/test_conformance.py::test_runner_passes_real_cases_and_fails_on_planted_faults",),
        "a new_weights case runs its crowd on the old weights (against references on the new ones)",
    ),
    Mutant(
        "thinking-budget-off-by-one", "rlt_runtime/engine/thinking_budget.py",
        "if not s.thinking or s.count < self.budget:",
        "if not s.thinking or s.count <= self.budget:",
        ("tests/runtime/test_thinking_budget.py::test_greedy_tokens_are_the_reference_forced_after_the_budget",),
        "the reasoning gets one token more than thinking_token_budget",
    ),
    Mutant(
        "thinking-budget-ignores-the-prompts-reasoning", "rlt_runtime/engine/thinking_budget.py",
        "count = len(prompt_ids) - opened - len(self.start) if thinking else 0",
        "count = 0",
        ("tests/runtime/test_thinking_budget.py::test_the_prompt_s_open_reasoning_counts",),
        "reasoning tokens already in the prompt do not count against the budget",
    ),
    Mutant(
        "thinking-end-marker-restarted", "rlt_runtime/engine/thinking_budget.py",
        "return self.end[k]",
        "return self.end[0]",
        ("tests/runtime/test_thinking_budget.py::test_greedy_tokens_are_the_reference_forced_after_the_budget",),
        "a forced end marker of several tokens never completes (its first token is forced again and again)",
    ),
    Mutant(
        "thinking-budget-rollback-keeps-the-drafts", "rlt_runtime/engine/thinking_budget.py",
        "self.state = self._history.pop()",
        "self._history.pop()",
        ("tests/runtime/test_thinking_budget.py::test_rollback_restores_the_state",
         "tests/runtime/test_thinking_budget.py::test_budgeted_requests_alone_in_a_crowd_and_under_speculation"),
        "checked drafts stay counted after the rollback, so speculation forces the end marker early",
    ),
    Mutant(
        "thinking-budget-overrides-the-grammar", "rlt_runtime/engine/thinking_budget.py",
        "if token is not None and (int(bitmask[row, token // 32]) >> (token % 32)) & 1:",
        "if token is not None:",
        ("tests/runtime/test_thinking_budget.py::test_a_grammar_is_narrowed_to_the_forced_token_only_where_it_allows_it",),
        "the forced end marker replaces a grammar's row even where the grammar refuses it",
    ),
    Mutant(
        "verify-rows-fuse-rope", "rlt_runtime/executor/speculative.py",
        "run.run_loops(rs, d, depth, out_v, fixed, shared_sequences=True)",
        "run.run_loops(rs, d, depth, out_v, fixed)",
        ("tests/runtime/test_speculative.py::test_verify_rows_never_attend_in_a_launch_that_writes_their_keys",),
        "a verify pass's loops attend in the fused decode launch, where a draft row may read the keys of the "
        "request's earlier drafts before their programs write them",
    ),
    Mutant(
        "verify-coda-fuses-rope", "rlt_runtime/executor/speculative.py",
        "raw_v = logits_v = run.head_logits(out_v, v_slots, v_pos, num_verify, cached=False, shared_sequences=True)",
        "raw_v = logits_v = run.head_logits(out_v, v_slots, v_pos, num_verify, cached=False)",
        ("tests/runtime/test_speculative.py::test_verify_rows_never_attend_in_a_launch_that_writes_their_keys",),
        "Huginn's coda attends in a fused decode launch in the verify pass, reading its draft rows' coda keys "
        "before their programs write them",
    ),
    Mutant(
        "fused-rows-of-one-sequence-unchecked", "rlt_kernels/attention.py",
        "if torch.unique(seq_slots[:live]).numel() != live:",
        "if torch.unique(seq_slots).numel() != seq_slots.shape[0] + 1:",
        ("tests/kernels/test_rope_paged_attention.py::test_rows_of_one_sequence_are_refused_on_the_cpu",),
        "rope_paged_attention takes live rows of one sequence on the CPU, where the fused launch's race cannot show",
    ),
)


class MutantError(RuntimeError):
    """A mutant that cannot be applied or whose tests could not run."""


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # "killed" | "survived" | "passed" | "failed" (the last two: --clean)
    output: str  # the tail of pytest's output


def apply(mutant: Mutant, root: Path) -> None:
    """Replace the mutant's line in the copy at `root`; exactly one line must match."""
    path = root / mutant.path
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == mutant.line]
    if len(hits) != 1:
        raise MutantError(f"mutant {mutant.name!r}: expected exactly one line {mutant.line!r} in {mutant.path}, "
                          f"found {len(hits)}; re-point the mutant at the line that now carries this code")
    old = lines[hits[0]]
    indent = old[: len(old) - len(old.lstrip())]
    lines[hits[0]] = indent + mutant.replacement + ("\n" if old.endswith("\n") else "")
    path.write_text("".join(lines))


def copy_repository(dest: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=IGNORED)
        else:
            shutil.copy2(src, dest / name)


@functools.cache
def fork_server():
    """The multiprocessing context whose processes fork from a server that imported PRELOADED."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))
    return context


def run_in_copy(root: str, args: list[str], env: dict[str, str], log: str) -> None:
    """Forked from the server: run pytest in the copy at `root`, with its output in `log` and its exit
    status in `log` + ".status" (the server's report of a process's exit code was seen to fail under
    load, as status 255, after pytest had finished)."""
    try:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.chdir(root)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = [root] + [p for p in sys.path if p and not Path(p).resolve().is_relative_to(ROOT)]
        origin = importlib.util.find_spec("rlt_runtime").origin
        if not Path(origin).resolve().is_relative_to(Path(root).resolve()):
            raise MutantError(f"the copy does not import its own rlt_runtime ({origin})")
        import pytest
    except BaseException:
        traceback.print_exc()
        sys.exit(NOT_STARTED)
    status = int(pytest.main(args))
    Path(log + ".status").write_text(str(status))
    sys.exit(status)


def run(mutant: Mutant, clean: bool = False) -> Outcome:
    """Run the mutant's kill tests in a temporary copy, mutated unless `clean`."""
    with tempfile.TemporaryDirectory(prefix=f"rlt-mutant-{mutant.name}-") as tmp:
        root = Path(tmp)
        copy_repository(root)
        if not clean:
            apply(mutant, root)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([tmp] + [p for p in [env.get("PYTHONPATH")] if p])
        env.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(root / ".hypothesis"))  # hypothesis took the server's cwd
        env.pop("PYTEST_ADDOPTS", None)
        log = root / "pytest-output.txt"
        args = ["-x", "-q", "-p", "no:cacheprovider", "-m", "", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                *mutant.tests]
        child = fork_server().Process(target=run_in_copy, args=(tmp, args, env, str(log)))
        child.start()
        child.join()
        if not log.exists():  # the child failed before run_in_copy (its status would read as "killed")
            raise MutantError(f"mutant {mutant.name!r}: the run did not start (status {child.exitcode})")
        tail = log.read_text(errors="replace")[-3000:]
        written = Path(f"{log}.status")  # pytest's own status (the process may die after it)
        status = int(written.read_text()) if written.exists() else child.exitcode
    if status not in (0, 1):
        raise MutantError(f"mutant {mutant.name!r}: pytest exited with status {status}:\n{tail}")
    if clean:
        return Outcome(mutant, "passed" if status == 0 else "failed", tail)
    return Outcome(mutant, "killed" if status == 1 else "survived", tail)


def run_all(chosen: list[Mutant], clean: bool = False):
    """Yield each mutant's Outcome, or the MutantError its run raised, in order. Two run at a time:
    each keeps about one core busy, so on a 2-core machine they take about half the time."""
    def one(mutant):
        try:
            return run(mutant, clean)
        except MutantError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=2) as pool:
        yield from pool.map(one, chosen)


def select(names: list[str]) -> list[Mutant]:
    known = {m.name: m for m in MUTANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown mutant(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    return [known[n] for n in names] if names else list(MUTANTS)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--clean", action="store_true", help="run the kill tests on an unmodified copy")
    args = parser.parse_args(argv)
    good = "passed" if args.clean else "killed"
    ok = True
    chosen = select(args.names)
    for mutant, outcome in zip(chosen, run_all(chosen, clean=args.clean)):
        if isinstance(outcome, MutantError):
            ok = False
            print(f"error     {mutant.name}: {outcome}", flush=True)
            continue
        ok &= outcome.status == good
        print(f"{outcome.status:9s} {mutant.name}: {mutant.bug}", flush=True)
        if outcome.status != good:
            print(outcome.output)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
