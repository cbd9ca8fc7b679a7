"""Sampling, filtered distributions and fused speculative acceptance on the H200.

Run on a GPU: ``pytest perf/test_bench_sampling.py --benchmark-json=out/sampling.json``;
``RLT_SAMPLING_SWEEP=1 pytest perf/test_bench_sampling.py -k sweep`` times candidate launch
constants (chunk widths, warps) for tuning.

Bytes counted are what a perfect kernel must move: the logits read once (sampling), plus the
fp32 distribution written once (filtered_probs), and for acceptance the probability rows the
round needs (p at the committed step, q there too after a rejection). The fraction of the
measured copy bandwidth therefore shows honestly what extra passes cost: greedy and
temperature-only sampling read the logits once (target >= 50% at batch 256), the top-k /
top-p paths make a max pass plus up to 8 threshold-search passes per filter, and every
random row computes one Philox4x32-10 word and two logs per vocabulary entry (the contract's
counter-based noise), which is compute, not bandwidth.

Times are medians of CUDA events around replays of a CUDA graph that calls the kernel once on
each of several copies of the inputs (rotated so the logits come from HBM, not L2), divided by
the number of calls: the engine runs these kernels inside graphs (eager times are recorded
too). Baselines are plain PyTorch (argmax, softmax + torch.multinomial, sort-based top-k /
top-p, vectorised rejection sampling) timed eagerly over the same rotated inputs.
"""

import itertools
import os

import pytest
import torch

from perf.conftest import cuda_time_ms, record, requires_cuda
from rlt_kernels import acceptance, sampling

pytestmark = requires_cuda

VOCABS = {"ouro": 49152, "huginn": 65536}
BATCHES = [1, 64, 256]
MODES = {  # temperature, top_k, top_p
    "greedy": (0.0, 0, 1.0),
    "temperature": (0.8, 0, 1.0),
    "top_p": (0.8, 0, 0.9),
    "top_k_top_p": (0.8, 50, 0.9),
}
ROTATION_BYTES = 512 << 20  # > 10x the H200's 50 MB L2
MAX_COPIES = 32
LATENCY_BYTES = 16 << 20
CHECK_ROWS = 8  # rows compared with the reference before timing (the tests check every bit)


def _copies(nbytes: int) -> int:
    return max(2, min(MAX_COPIES, ROTATION_BYTES // max(nbytes, 1)))


def _graph_ms(calls) -> float:
    """Per-call device time of a CUDA graph that runs every callable in ``calls`` once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = cuda_time_ms(graph.replay) / len(calls)
    del graph
    return ms


def _cycling(calls):
    it = itertools.cycle(calls)
    return lambda: next(it)()


def _report(benchmark, roofline, name, calls, baseline_calls, bytes_moved, **extra):
    """Record the kernel (graph replay: rates and roofline fraction; eager too) against the
    torch baseline timed eagerly (plain PyTorch sampling is not graph-capturable in general:
    torch.multinomial validates its input on the host). ``speedup_vs_baseline``: graph kernel
    vs eager torch, as each would run in the engine; ``speedup_eager_vs_baseline``: both eager."""
    def run_synced():
        calls[0]()
        torch.cuda.synchronize()

    benchmark.pedantic(run_synced, rounds=10, warmup_rounds=2)
    ms = _graph_ms(calls)
    eager_ms = cuda_time_ms(_cycling(calls))
    baseline_ms = cuda_time_ms(_cycling(baseline_calls))
    info = record(
        benchmark, roofline, name=name, ms=ms, bytes_moved=bytes_moved, baseline_ms=baseline_ms,
        eager_ms=eager_ms, speedup_eager_vs_baseline=baseline_ms / eager_ms,
        regime="bandwidth" if bytes_moved >= LATENCY_BYTES else "latency", latency_us=ms * 1e3, **extra,
    )
    print(f"{name}: {ms * 1e3:.1f} us, {info['gbps']:.0f} GB/s ({info['frac_bandwidth']:.0%} of copy), "
          f"{info['speedup_vs_baseline']:.2f}x torch (eager {baseline_ms / eager_ms:.2f}x) [{info['regime']}]")


def _sampling_inputs(batch, v, mode, dtype, seed):
    temperature, top_k, top_p = MODES[mode]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn((batch, v), generator=gen, device="cuda") * 3).to(dtype)
    full = lambda value, dt=torch.float32: torch.full((batch,), value, dtype=dt, device="cuda")  # noqa: E731
    params = (full(temperature), full(top_k, torch.int32), full(top_p), full(0.0))
    seeds = torch.arange(batch, dtype=torch.int64, device="cuda") + seed
    positions = torch.arange(batch, dtype=torch.int64, device="cuda") + 1000
    return logits, params, seeds, positions


def _torch_sample_fn(mode, logits, params, out):
    """A plain-PyTorch sampler for the mode (the system we replace did about this)."""
    temperature, _, top_p, _ = params
    k = MODES[mode][1]
    if mode == "greedy":
        return lambda: torch.argmax(logits, dim=1, out=out)
    scale = temperature[:, None]
    if mode == "temperature":
        return lambda: out.copy_(torch.multinomial(torch.softmax(logits.float() / scale, dim=1), 1).squeeze(1))

    def filtered():
        z = logits.float() / scale
        zs, idx = z.sort(dim=1, descending=True)
        if k:
            zs = zs.masked_fill(zs < zs[:, k - 1 : k], float("-inf"))
        ps = torch.softmax(zs, dim=1)
        drop = (ps.cumsum(1) - ps) >= top_p[:, None]
        ps = ps.masked_fill(drop, 0.0)
        choice = torch.multinomial(ps, 1)
        out.copy_(idx.gather(1, choice).squeeze(1))

    return filtered


def _torch_probs_fn(mode, logits, params, out):
    """A plain-PyTorch processed distribution for the mode (sort-based thresholds)."""
    temperature, _, top_p, _ = params
    k, v = MODES[mode][1], logits.shape[1]
    if mode == "greedy":
        return lambda: out.zero_().scatter_(1, logits.argmax(1, keepdim=True), 1.0)

    def run():
        z = logits.float() / temperature[:, None]
        if mode != "temperature":
            zs, _ = z.sort(dim=1, descending=True)
            kth = zs[:, k - 1 : k] if k else zs[:, -1:]
            ps = torch.softmax(zs.masked_fill(zs < kth, float("-inf")), dim=1)
            boundary = (ps.cumsum(1) < top_p[:, None]).sum(1, keepdim=True).clamp(max=v - 1)
            z = z.masked_fill(z < torch.maximum(kth, zs.gather(1, boundary)), float("-inf"))
        out.copy_(torch.softmax(z, dim=1))

    return run


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("model", list(VOCABS))
def test_bench_sample(benchmark, roofline, model, batch, mode, dtype):
    v = VOCABS[model]
    nbytes = batch * v * torch.empty((), dtype=dtype).element_size()
    inputs = [_sampling_inputs(batch, v, mode, dtype, seed) for seed in range(_copies(nbytes))]
    out = torch.empty(batch, dtype=torch.int64, device="cuda")
    calls = [
        (lambda lg=lg, pr=pr, s=s, p=p: sampling.sample(lg, *pr, s, p, out=out)) for lg, pr, s, p in inputs
    ]
    calls[0]()
    lg, pr, s, p = inputs[0]
    n = CHECK_ROWS  # sanity only: the tests check every bit
    assert torch.equal(out[:n], sampling.sample_reference(lg[:n], *(t[:n] for t in pr), s[:n], p[:n]))
    baseline_out = torch.empty_like(out)
    baseline_calls = [_torch_sample_fn(mode, lg, pr, baseline_out) for lg, pr, _, _ in inputs]
    _report(benchmark, roofline, f"sample/{model}/B{batch}/{mode}/{str(dtype)[6:]}", calls, baseline_calls, nbytes,
            batch=batch, vocab=v, mode=mode)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("batch", [64, 256])
def test_bench_filtered_probs(benchmark, roofline, batch, mode):
    """The proposal / target tensor of speculative decoding (fp32 logits, Ouro vocabulary)."""
    v = VOCABS["ouro"]
    nbytes = 2 * batch * v * 4  # read logits, write probabilities
    inputs = [_sampling_inputs(batch, v, mode, torch.float32, seed) for seed in range(_copies(nbytes))]
    out = torch.empty((batch, v), device="cuda")
    calls = [(lambda lg=lg, pr=pr: sampling.filtered_probs(lg, *pr, out=out)) for lg, pr, _, _ in inputs]
    calls[0]()
    expected = sampling.filtered_probs_reference(inputs[0][0][:CHECK_ROWS], *(t[:CHECK_ROWS] for t in inputs[0][1]))
    # A top-p boundary token of ~1e-4 probability may fall either way within fp32 rounding.
    torch.testing.assert_close(out[:CHECK_ROWS], expected, rtol=1e-3, atol=2e-4)
    baseline_calls = [_torch_probs_fn(mode, lg, pr, out) for lg, pr, _, _ in inputs]
    _report(benchmark, roofline, f"filtered_probs/ouro/B{batch}/{mode}", calls, baseline_calls, nbytes,
            batch=batch, vocab=v, mode=mode)


def _torch_accept(drafts, num_drafts, target_tokens, target_probs, draft_probs, greedy, out):
    """Plain-PyTorch speculative acceptance (vectorised; same math, torch randomness)."""
    r, k = drafts.shape
    steps = torch.arange(k + 1, device=drafts.device)
    rows = torch.arange(r, device=drafts.device)
    if greedy:
        ok = (drafts == target_tokens[:, :k]) & (steps[:k] < num_drafts[:, None])
        n_acc = ok.int().cumprod(1).sum(1)
        final = target_tokens[rows, n_acc]
    else:
        p_y = target_probs[:, :k].gather(2, drafts[..., None]).squeeze(2)
        q_y = draft_probs.gather(2, drafts[..., None]).squeeze(2)
        ok = (torch.rand_like(p_y) * q_y < p_y) & (steps[:k] < num_drafts[:, None])
        n_acc = ok.int().cumprod(1).sum(1)
        rejected = n_acc < num_drafts
        p_row = target_probs[rows, n_acc]
        q_row = draft_probs[rows, n_acc.clamp(max=k - 1)]
        residual = torch.where(rejected[:, None], (p_row - q_row).clamp(min=0), p_row)
        residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, p_row)
        final = torch.multinomial(residual, 1).squeeze(1)
    padded = torch.cat([drafts, drafts[:, :1]], 1)
    out.copy_(torch.where(steps < n_acc[:, None], padded, torch.where(steps == n_acc[:, None], final[:, None], -1)))


def _acceptance_inputs(rows, k, v, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    target_probs = torch.softmax(torch.randn((rows, k + 1, v), generator=gen, device="cuda") * 3, dim=-1)
    # The proposal is a perturbed target, as a few-loop draft of the same model would be.
    noise = torch.randn((rows, k, v), generator=gen, device="cuda")
    draft_probs = torch.softmax(torch.log(target_probs[:, :k]) + noise, dim=-1)
    drafts = torch.multinomial(draft_probs.reshape(-1, v), 1, generator=gen).view(rows, k)
    num_drafts = torch.full((rows,), k, dtype=torch.int32, device="cuda")
    target_tokens = target_probs.argmax(-1)
    seeds = torch.arange(rows, dtype=torch.int64, device="cuda") + seed
    positions = torch.arange(rows, dtype=torch.int64, device="cuda") * (k + 1)
    return drafts, num_drafts, target_tokens, target_probs, draft_probs, seeds, positions


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampling"])
@pytest.mark.parametrize("rows", [64, 256])
def test_bench_accept_draft(benchmark, roofline, rows, greedy):
    k, v = 4, VOCABS["ouro"]
    round_bytes = rows * (k + 1) * v * 4 * 2
    inputs = [_acceptance_inputs(rows, k, v, seed) for seed in range(_copies(round_bytes))]
    greedy_mask = torch.full((rows,), greedy, dtype=torch.bool, device="cuda")
    out_tokens = torch.empty((rows, k + 1), dtype=torch.int64, device="cuda")
    num_accepted = torch.empty(rows, dtype=torch.int32, device="cuda")

    def call(d, n, tt, tp, dp, s, p):
        return lambda: acceptance.accept_draft(
            d, n, tt, None if greedy else tp, None if greedy else dp, greedy_mask, s, p,
            out_tokens=out_tokens, num_accepted=num_accepted,
        )

    calls = [call(*inp) for inp in inputs]
    calls[0]()
    d, n, tt, tp, dp, s, p = (t[:CHECK_ROWS] for t in inputs[0])
    ref_tokens, ref_acc = acceptance.accept_draft_reference(
        d, n, tt, None if greedy else tp, None if greedy else dp, greedy_mask[:CHECK_ROWS], s, p
    )
    assert torch.equal(out_tokens[:CHECK_ROWS], ref_tokens) and torch.equal(num_accepted[:CHECK_ROWS], ref_acc)
    if greedy:
        bytes_moved = rows * (2 * k + 1) * 8  # drafts and target tokens
    else:  # p at the committed step, q there too after a rejection, and the K p(y), q(y) reads
        rejected = int((num_accepted < k).sum())
        bytes_moved = (rows + rejected) * v * 4 + rows * k * 8
    baseline_out = torch.empty_like(out_tokens)
    baseline_calls = [
        (lambda d=d, n=n, tt=tt, tp=tp, dp=dp: _torch_accept(d, n, tt, tp, dp, greedy, baseline_out))
        for d, n, tt, tp, dp, _, _ in inputs
    ]
    _report(benchmark, roofline, f"accept_draft/ouro/R{rows}/K{k}/{'greedy' if greedy else 'sampling'}", calls,
            baseline_calls, bytes_moved, rows=rows, drafts=k, vocab=v,
            mean_accepted=float(num_accepted.float().mean()))


SWEEP = [  # BLOCK_V, SEARCH_BLOCK_V, NUM_WARPS
    (block, search, warps) for block in (1024, 2048, 4096) for search in (256, 512) for warps in (4, 8, 16)
]


@pytest.mark.skipif(not os.environ.get("RLT_SAMPLING_SWEEP"), reason="set RLT_SAMPLING_SWEEP=1 to tune")
@pytest.mark.parametrize("mode", ["greedy", "temperature", "top_k_top_p"])
@pytest.mark.parametrize("config", SWEEP, ids=[f"B{b}-S{s}-W{w}" for b, s, w in SWEEP])
def test_bench_sample_sweep(benchmark, roofline, monkeypatch, config, mode):
    """Ouro vocabulary, batch 256, fp32 logits, under each candidate launch configuration."""
    block, search, warps = config
    monkeypatch.setattr(sampling, "BLOCK_V", block)
    monkeypatch.setattr(sampling, "SEARCH_BLOCK_V", search)
    monkeypatch.setattr(sampling, "NUM_WARPS", warps)
    batch, v = 256, VOCABS["ouro"]
    nbytes = batch * v * 4
    inputs = [_sampling_inputs(batch, v, mode, torch.float32, seed) for seed in range(_copies(nbytes))]
    out = torch.empty(batch, dtype=torch.int64, device="cuda")
    calls = [(lambda lg=lg, pr=pr, s=s, p=p: sampling.sample(lg, *pr, s, p, out=out)) for lg, pr, s, p in inputs]
    baseline_out = torch.empty_like(out)
    baseline_calls = [_torch_sample_fn(mode, lg, pr, baseline_out) for lg, pr, _, _ in inputs[:2]]
    _report(benchmark, roofline, f"sweep/sample/B{block}-S{search}-W{warps}/{mode}", calls, baseline_calls, nbytes,
            block=block, search_block=search, num_warps=warps, mode=mode)
