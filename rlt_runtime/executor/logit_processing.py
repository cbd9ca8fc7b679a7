"""Logit processing on the device: logit bias, min_tokens, bad words and the three penalties.

Semantics (vLLM's), per row, applied to the fp32 logits x in this order before temperature and
the filters of `rlt_kernels.sampling`:

    x[t] += logit_bias[t]
    x[t] = -inf  for t in the request's min-token stop ids while the output has < min_tokens tokens
    x[t] = -inf  for the last token t of each bad word whose other tokens end the output
    x[t] = x[t] / r if x[t] > 0 else x[t] * r     for t in the prompt or the output (r: repetition)
    x[t] -= frequency * count[t] + presence * (count[t] > 0)    (count: occurrences in the output)

Every piece of state lives in persistent per-slot device tensors that the step programs read and
update in place, so processing runs inside the step's CUDA graph with no host sync:

    counts       int32 [S, V]   output-token counts (committed tokens are scatter-added by the step)
    prompt_mask  bool  [S, V]   tokens present in the prompt
    rep, pres, freq   fp32 [S]  penalty parameters
    bias_ids, bias_vals [S, MAX_LOGIT_BIAS]   logit_bias as a padded list (padding adds 0 to id 0)
    min_tokens, prompt_len int64 [S]; stop_ids int64 [S, MAX_MIN_TOKEN_STOPS] (-1 padding)
    bad_prefix int64 [S, MAX_BAD_WORDS, T], bad_last int64 [S, MAX_BAD_WORDS]   (T = MAX_BAD_WORD_TOKENS - 1;
                 prefixes right-aligned, ANY in unused positions, bad_last -1 for no word)
    tail int64 [S + 1, T]       the last T output tokens (-1 before the output starts; row S is a sink)

The [S, V] tensors cost S x V x 5 bytes (256 slots x 151,936 tokens: 194 MB); they are allocated
with the runner unless the engine runs with enable_penalties=False (then the engine refuses
requests with a penalty and the rest of the processing runs without them), and the KV planner
counts `nbytes` (cache/memory.py). A slot's state is written when a request is admitted (also after a preemption,
from the host's copy of its tokens, so recompute and swap resume with the same counts); steps that
carry no request that processes logits run programs without processing and leave the state alone. Everything is row-wise, so a row's result does not depend on its batch neighbours.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..sampling_params import MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS, MAX_LOGIT_BIAS
from .staging import upload_arrays

MAX_MIN_TOKEN_STOPS = 64  # EOS ids + stop_token_ids a request's min_tokens can hold back
TAIL = MAX_BAD_WORD_TOKENS - 1
ANY = -2  # a bad-word prefix position that matches any token (words shorter than the longest)


class LogitProcessing:
    """Per-slot device state of logit processing and the in-graph apply / commit steps."""

    def __init__(self, num_slots: int, vocab_size: int, device, penalties: bool = True):
        """penalties: allocate counts and prompt_mask ([S, V]) for the three penalties; without
        them (None) admitted requests must have neutral penalties (the engine checks)."""
        s, v, d = num_slots, vocab_size, torch.device(device)
        self.num_slots, self.vocab_size, self.device = s, v, d
        self.counts = torch.zeros((s, v), dtype=torch.int32, device=d) if penalties else None
        self.prompt_mask = torch.zeros((s, v), dtype=torch.bool, device=d) if penalties else None
        self.rep = torch.ones(s, dtype=torch.float32, device=d)
        self.pres = torch.zeros(s, dtype=torch.float32, device=d)
        self.freq = torch.zeros(s, dtype=torch.float32, device=d)
        self.bias_ids = torch.zeros((s, MAX_LOGIT_BIAS), dtype=torch.int64, device=d)
        self.bias_vals = torch.zeros((s, MAX_LOGIT_BIAS), dtype=torch.float32, device=d)
        self.min_tokens = torch.zeros(s, dtype=torch.int64, device=d)
        self.prompt_len = torch.zeros(s, dtype=torch.int64, device=d)
        self.stop_ids = torch.full((s, MAX_MIN_TOKEN_STOPS), -1, dtype=torch.int64, device=d)
        self.bad_prefix = torch.full((s, MAX_BAD_WORDS, TAIL), ANY, dtype=torch.int64, device=d)
        self.bad_last = torch.full((s, MAX_BAD_WORDS), -1, dtype=torch.int64, device=d)
        self.tail = torch.full((s + 1, TAIL), -1, dtype=torch.int64, device=d)

    @property
    def nbytes(self) -> int:
        """Device bytes of the whole per-slot state (what the KV planner sets aside)."""
        return sum(t.numel() * t.element_size() for t in vars(self).values() if isinstance(t, torch.Tensor))

    # ---- admission (host → device, outside the step programs) ------------------------------------
    def admit(self, requests) -> None:
        """Write the state of admitted requests' slots from their parameters and host-side tokens.

        Every admitted request gets its parameters (neutral ones leave the logits bit for bit as
        they are, whatever counts the slot holds, so a request without processing may share a
        processed step); the counts and prompt mask are filled for requests that process logits.
        Each request carries `slot`, `params`, `prompt_token_ids`, `output_token_ids` (all the
        committed outputs: the counts continue from them after a preemption), `min_token_stops`
        and `bad_word_ids` (token-id lists, checked by the engine)."""
        if not requests:
            return
        m = len(requests)
        a = {
            "slot": np.asarray([r.slot for r in requests], np.int64),
            "rep": np.asarray([r.params.repetition_penalty for r in requests], np.float32),
            "pres": np.asarray([r.params.presence_penalty for r in requests], np.float32),
            "freq": np.asarray([r.params.frequency_penalty for r in requests], np.float32),
            "min_tokens": np.asarray([r.params.min_tokens for r in requests], np.int64),
            "prompt_len": np.asarray([r.num_prompt_tokens for r in requests], np.int64),
        }
        bias_ids = np.zeros((m, MAX_LOGIT_BIAS), np.int64)
        bias_vals = np.zeros((m, MAX_LOGIT_BIAS), np.float32)
        stops = np.full((m, MAX_MIN_TOKEN_STOPS), -1, np.int64)
        prefix = np.full((m, MAX_BAD_WORDS, TAIL), ANY, np.int64)
        last = np.full((m, MAX_BAD_WORDS), -1, np.int64)
        tail = np.full((m, TAIL), -1, np.int64)
        p_row, p_tok, o_row, o_tok = [], [], [], []
        for i, r in enumerate(requests):
            for j, (t, b) in enumerate((r.params.logit_bias or {}).items()):
                bias_ids[i, j], bias_vals[i, j] = t, b
            stop = [t for t in r.min_token_stops if t < self.vocab_size]
            stops[i, : len(stop)] = stop
            for w, word in enumerate(r.bad_word_ids):
                last[i, w] = word[-1]
                if len(word) > 1:
                    prefix[i, w, TAIL - len(word) + 1 :] = word[:-1]
            if not r.params.processes_logits:
                continue
            recent = r.output_token_ids[-TAIL:] if TAIL else []
            tail[i, TAIL - len(recent) :] = recent
            uniq = sorted(set(r.prompt_token_ids))
            p_row += [i] * len(uniq)
            p_tok += uniq
            o_row += [i] * len(r.output_token_ids)
            o_tok += r.output_token_ids
        a.update(bias_ids=bias_ids, bias_vals=bias_vals, stops=stops, prefix=prefix, last=last, tail=tail,
                 p_row=np.asarray(p_row, np.int64), p_tok=np.asarray(p_tok, np.int64),
                 o_row=np.asarray(o_row, np.int64), o_tok=np.asarray(o_tok, np.int64))
        dev = upload_arrays(a, self.device)
        s = dev["slot"]
        if self.counts is not None:
            self.counts[s] = 0
            self.prompt_mask[s] = False
            self.prompt_mask[s[dev["p_row"]], dev["p_tok"]] = True
            self.counts.index_put_((s[dev["o_row"]], dev["o_tok"]), torch.ones_like(dev["o_tok"], dtype=torch.int32),
                                   accumulate=True)
        for name in ("rep", "pres", "freq", "min_tokens", "prompt_len"):
            getattr(self, name)[s] = dev[name]
        self.bias_ids[s] = dev["bias_ids"].view(m, MAX_LOGIT_BIAS)
        self.bias_vals[s] = dev["bias_vals"].view(m, MAX_LOGIT_BIAS)
        self.stop_ids[s] = dev["stops"].view(m, MAX_MIN_TOKEN_STOPS)
        self.bad_prefix[s] = dev["prefix"].view(m, MAX_BAD_WORDS, TAIL)
        self.bad_last[s] = dev["last"].view(m, MAX_BAD_WORDS)
        self.tail[s] = dev["tail"].view(m, TAIL)

    # ---- inside the step programs ----------------------------------------------------------------
    def apply(self, logits: torch.Tensor, idx: torch.Tensor, out_pos: torch.Tensor, extra=None, num_extra=None):
        """Processed fp32 logits [B, V] (a new tensor; `logits` is left as it is).

        idx int64 [B]: the rows' slots; out_pos int64 [B]: the position of the token being chosen.
        extra int64 [B, E] / num_extra int64 [B]: tokens that follow the committed output but are
        not committed yet (a speculative round's earlier drafts), the first num_extra of each row.
        """
        b, v = logits.shape
        dev = logits.device
        x = logits.to(torch.float32).clone()
        x.scatter_add_(1, self.bias_ids[idx], self.bias_vals[idx])
        ban = torch.zeros((b, v), dtype=torch.float32, device=dev)
        early = (out_pos - self.prompt_len[idx]) < self.min_tokens[idx]
        sid = self.stop_ids[idx]
        on = (sid >= 0) & early[:, None]
        ban.scatter_add_(1, torch.where(on, sid, torch.zeros_like(sid)), on.to(torch.float32))
        tail = self.tail[idx]
        cnt = self.counts[idx] if self.counts is not None else None
        if extra is not None:
            steps = torch.arange(extra.shape[1], device=dev)
            valid = steps[None, :] < num_extra[:, None]
            seq = torch.cat([tail, torch.where(valid, extra, torch.full_like(extra, -1))], dim=1)
            tail = seq.gather(1, num_extra[:, None] + torch.arange(TAIL, device=dev)[None, :])
            if cnt is not None:
                cnt.scatter_add_(1, torch.where(valid, extra, torch.zeros_like(extra)), valid.to(torch.int32))
        pre, last = self.bad_prefix[idx], self.bad_last[idx]
        hit = ((pre == tail[:, None, :]) | (pre == ANY)).all(dim=2) & (last >= 0)
        ban.scatter_add_(1, torch.where(hit, last, torch.zeros_like(last)), hit.to(torch.float32))
        x = x.masked_fill(ban > 0, -math.inf)
        if cnt is None:
            return x
        seen = cnt > 0
        rep = self.rep[idx][:, None]
        x = torch.where(self.prompt_mask[idx] | seen, torch.where(x > 0, x / rep, x * rep), x)
        return x - self.freq[idx][:, None] * cnt.to(torch.float32) - self.pres[idx][:, None] * seen.to(torch.float32)

    def commit(self, idx: torch.Tensor, tokens: torch.Tensor, live: torch.Tensor) -> None:
        """Count committed tokens: tokens int64 [B, C] (a prefix of each row, -1 after it), rows
        with live False ([B] bool: padding, past the live count) change nothing."""
        valid = live[:, None] & (tokens >= 0)
        if self.counts is not None:
            flat = torch.where(valid, idx[:, None] * self.vocab_size + tokens, torch.zeros_like(tokens))
            self.counts.view(-1).index_add_(0, flat.reshape(-1), valid.reshape(-1).to(torch.int32))
        n = valid.sum(dim=1)
        seq = torch.cat([self.tail[idx], torch.where(valid, tokens, torch.full_like(tokens, -1))], dim=1)
        new = seq.gather(1, n[:, None] + torch.arange(TAIL, device=tokens.device)[None, :])
        self.tail[torch.where(live, idx, torch.full_like(idx, self.num_slots))] = new
