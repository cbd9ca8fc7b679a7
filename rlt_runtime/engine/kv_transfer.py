"""Handing a request from a prefill engine to a decode engine (disaggregated prefill).

The prefill engine's scheduler never schedules decode rows (`Scheduler.hold_decodes`): a request
stops once its prompt is in the cache and its first token is sampled. `export_handoffs` then
takes every such request out of the prefill engine with the swap-preemption machinery: its worker
copies its blocks (every plane and layer, and the key-depth rows of its plane-0 blocks) to host
memory exactly as a swap-out does, the scheduler frees its blocks and slot, and what the decode
engine needs travels as a `Handoff`: plain metadata plus those host tensors.

`import_handoff` rebuilds the request in the decode engine: `add_request` with the same arrival
index (so unseeded samples get the same random keys), the committed first token replayed through
the engine's own bookkeeping (`LLMEngine._append`: text, stop checks, grammar matcher, metrics),
and the request queued in the swapped-out state (`Request.swapped`, its K/V held by the decode
engine's worker under a fresh swap id), so the scheduler's swap-in admits it and the worker copies
the blocks into the decode engine's pool. Sampling needs no RNG
state: a token's randomness is keyed by (request key, position), so decode continues with the
bits one engine would produce.

`send_tensors` / `recv_tensors` move the tensors between the two processes with torch.distributed
point-to-point (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from typing import Optional

import torch

from ..outputs import TokenLogprob
from ..step import StepInput
from .request import Request, Status
from .wire import params_from_dict, params_to_dict

TRANSFER_TIMEOUT_S = 300  # a transfer (or the group's set-up) that waits longer fails the worker
PREFILL_RANK, DECODE_RANK = 0, 1


@dataclasses.dataclass
class Handoff:
    """One request (all its samples) leaving the prefill engine.

    meta: plain data (request, sampling parameters as a dict, each sample's committed tokens,
    depths, log-probabilities, and for each sample still running the shapes and dtypes of its K/V).
    tensors: per running sample in sample order: K and V [layers, blocks * planes, block_size,
    kv_heads, head_dim] (FP8 planes as uint8 bytes) and key depths int32 [blocks, block_size].
    """

    meta: dict
    tensors: list[torch.Tensor]

    @property
    def request_id(self) -> str:
        return self.meta["request_id"]


def _lp_out(lp: Optional[TokenLogprob]):
    return None if lp is None else (lp.logprob, dict(lp.top))


def _lp_in(data) -> Optional[TokenLogprob]:
    return None if data is None else TokenLogprob(data[0], dict(data[1]))


def _ready(r: Request) -> bool:
    """A running request with its first token committed and nothing in flight."""
    return (r.status == Status.RUNNING and bool(r.output_token_ids) and r.num_inflight == 0
            and r.inflight_outputs == 0 and not r.is_prefilling)


def export_handoffs(engine) -> list[Handoff]:
    """Take every request group whose unfinished samples all hold their first token out of the
    prefill engine `engine` (an LLMEngine with `scheduler.hold_decodes` set). Their blocks and slots
    are free when this returns; groups whose samples all finished stay (the engine outputs them)."""
    out = []
    for group_id, group in list(engine._groups.items()):
        live = [r for r in group if not r.finished]
        if live and all(_ready(r) for r in live):
            out.append(_export(engine, group_id, group, live))
    return out


def _export(engine, group_id: str, group: list[Request], live: list[Request]) -> Handoff:
    kv = engine.kv
    step = StepInput(swap_out=[(-1 - i, [tuple(p) for p in list(kv.table(r.request_id))[: kv.blocks_for(r.num_computed)]])
                               for i, r in enumerate(live)])
    with torch.cuda.device(engine.device) if engine.device.type == "cuda" else contextlib.nullcontext():
        copies = iter(engine.executor.export_swapped(step))  # complete host copies
    first = group[0]
    samples, tensors = [], []
    for r in group:
        saved = None
        if not r.finished:
            saved = next(copies)
            tensors += saved
        m = r.metrics
        samples.append({
            "token_ids": list(r.output_token_ids), "exit_depths": list(r.exit_depths),
            "logprobs": [_lp_out(lp) for lp in r.logprobs] if r.params.logprobs is not None else None,
            "cumulative_logprob": r.cumulative_logprob, "num_computed": r.num_computed,
            "first_scheduled_time": m.first_scheduled_time, "first_token_time": m.first_token_time,
            "num_cached_tokens": m.num_cached_tokens, "num_preemptions": m.num_preemptions,
            "kv": None if saved is None else [(list(t.shape), str(t.dtype).removeprefix("torch.")) for t in saved],
        })
    meta = {
        "request_id": group_id, "prompt_token_ids": list(first.prompt_token_ids), "prompt": engine._prompts.get(group_id),
        "params": params_to_dict(first.params), "arrival_time": first.metrics.arrival_time,
        "arrival_index": first.arrival_index, "prompt_logprobs": [_lp_out(lp) for lp in first.prompt_logprobs],
        "samples": samples,
    }
    for r in live:
        engine.scheduler.finish(r)
    engine._groups.pop(group_id, None)
    engine._prompts.pop(group_id, None)
    for r in group:
        engine._trackers.pop(id(r), None)
    return Handoff(meta, tensors)


def import_handoff(engine, handoff: Handoff) -> None:
    """Queue `handoff`'s request in the decode engine `engine` in the swapped-out state (its next
    step swaps it in and decodes). RequestError when the decode engine rejects the request."""
    meta = handoff.meta
    request_id = meta["request_id"]
    engine.add_request(request_id, {"prompt_token_ids": meta["prompt_token_ids"], "prompt": meta["prompt"]},
                       params_from_dict(meta["params"]), arrival_time=meta["arrival_time"],
                       arrival_index=meta["arrival_index"])
    group = engine._groups[request_id]
    group[0].prompt_logprobs = [_lp_in(lp) for lp in meta["prompt_logprobs"]]
    tensors = iter(handoff.tensors)
    for req, s in zip(group, meta["samples"]):
        saved = None if s["kv"] is None else [next(tensors) for _ in s["kv"]]
        m = req.metrics
        m.first_scheduled_time, m.num_cached_tokens = s["first_scheduled_time"], s["num_cached_tokens"]
        m.num_preemptions = s["num_preemptions"]
        req.cumulative_logprob = s["cumulative_logprob"]
        if req.draft is not None:  # the prefill row's round (no drafts, one token), as one engine counts it
            engine.policy.observe(req.draft, 0, 1)
        lps = s["logprobs"] or [None] * len(s["token_ids"])
        for token, depth, lp in zip(s["token_ids"], s["exit_depths"], lps):
            if req.finished:
                break
            engine._append(req, token, depth, _lp_in(lp))
        m.first_token_time = s["first_token_time"]
        if not req.finished:
            if saved is None:
                raise AssertionError(f"{req.request_id}: the prefill engine sent no K/V for a running sample")
            swap_id = engine._steps.new_swap_id()
            engine.executor.import_swapped(swap_id, saved)
            req.swapped = {"num_computed": s["num_computed"], "id": swap_id}


# ---- transport ------------------------------------------------------------------------------------------
def transfer_backend(device: str) -> str:
    """The torch.distributed backend that moves K/V between engines on `device`."""
    return "nccl" if device.startswith("cuda") else "gloo"


def init_transfer_group(rank: int, init_method: str, device: str) -> None:
    """Join the two-process group (rank 0: prefill, 1: decode) that carries the K/V."""
    import torch.distributed as dist

    kwargs = {}
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        kwargs["device_id"] = torch.device(device)
    dist.init_process_group(transfer_backend(device), init_method=init_method, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=TRANSFER_TIMEOUT_S), **kwargs)
    # One round trip now, while both ranks wait for it: NCCL sets up the pair's point-to-point
    # communicator on its first send/recv, which would otherwise block the first handoff's send.
    probe = torch.zeros(1, device=torch.device(device) if device.startswith("cuda") else "cpu")
    if rank == PREFILL_RANK:
        dist.send(probe, dst=DECODE_RANK)
    else:
        dist.recv(probe, src=PREFILL_RANK)


def send_tensors(tensors: list[torch.Tensor], device: str) -> list:
    """Post sends of `tensors` to the decode rank (NCCL: from a device copy); returns (work, tensor)
    pairs to keep until `work.is_completed()`."""
    import torch.distributed as dist

    out = []
    for t in tensors:
        t = t.to(device) if device.startswith("cuda") else t.contiguous()
        out.append((dist.isend(t, dst=DECODE_RANK), t))
    return out


def recv_tensors(specs: list, device: str) -> list[torch.Tensor]:
    """Receive tensors of the given (shape, dtype name) from the prefill rank, in order (on `device`
    with NCCL, on the host with gloo)."""
    import torch.distributed as dist

    where = torch.device(device) if device.startswith("cuda") else torch.device("cpu")
    out = []
    for shape, dtype in specs:
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=where)
        dist.recv(t, src=PREFILL_RANK)
        out.append(t)
    return out


def close_transfer_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
