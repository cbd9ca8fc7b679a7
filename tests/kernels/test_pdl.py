"""Programmatic dependent launch: which launches take it, and that it never changes a result."""

import ast
import importlib
import inspect
import pkgutil

import pytest
import torch

import rlt_kernels
from rlt_kernels import _pdl, attention, gemm, kv_cache, linear_norm, norms

from checks import randn, seeded


def test_pdl_off_on_cpu_and_when_disabled(monkeypatch):
    """CPU tensors (and the interpreter) never launch dependently; RLT_PDL=0 turns it off on CUDA."""
    assert not _pdl.pdl_launch(torch.empty(1))
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        t = torch.empty(1, device="cuda")
        assert _pdl.pdl_launch(t)
        monkeypatch.setenv("RLT_PDL", "0")
        assert not _pdl.pdl_launch(t)


class _OnDevice:
    """Stands for a tensor on CUDA device 0 (pdl_launch reads only its device)."""

    device = torch.device("cuda", 0)


@pytest.mark.parametrize("major", [8, 9, 10])
def test_every_launch_on_hopper_is_dependent(monkeypatch, major):
    """Every launch on a Hopper or newer device is dependent, none before Hopper (checked with a
    stand-in device, so it runs without a GPU)."""
    monkeypatch.setattr(_pdl, "interpreter_active", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (major, 0))
    monkeypatch.delenv("RLT_PDL", raising=False)
    _pdl._has_pdl.cache_clear()
    try:
        assert _pdl.pdl_launch(_OnDevice()) == (major >= 9)
        monkeypatch.setenv("RLT_PDL", "0")
        assert not _pdl.pdl_launch(_OnDevice())
    finally:
        _pdl._has_pdl.cache_clear()


# Every rlt_kernels module that launches dependently (source mentions launch_pdl), _pdl itself aside.
LAUNCHING_MODULES = [
    module for module in (importlib.import_module(f"rlt_kernels.{info.name}")
                          for info in pkgutil.iter_modules(rlt_kernels.__path__) if info.name != "_pdl")
    if "launch_pdl" in inspect.getsource(module)
]
MEMORY_OPS = {"load", "store", "atomic_add", "atomic_cas", "atomic_xchg", "atomic_max", "atomic_min", "atomic_and",
              "atomic_or", "atomic_xor", "load_tensor_descriptor", "store_tensor_descriptor"}


def _memory_ops(node: ast.AST, functions: dict, seen: set) -> list:
    """The memory accesses (and returns) under node, following calls into the module's own functions."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Return):
            found.append("return")
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Attribute) and func.attr in MEMORY_OPS:
            found.append(func.attr)
        elif isinstance(func, ast.Name) and func.id in functions and func.id not in seen:
            seen.add(func.id)
            found += [f"{func.id}: {op}" for op in _memory_ops(functions[func.id], functions, seen) if op != "return"]
    return found


def _waits(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id == "wait_for_inputs"
            and [a.id for a in stmt.value.args if isinstance(a, ast.Name)] == ["PDL"])


@pytest.mark.parametrize("module", LAUNCHING_MODULES, ids=lambda m: m.__name__.split(".")[-1])
def test_kernels_wait_before_any_memory_access(module):
    """The dependent-launch contract, read from the kernels' source: every kernel taking PDL calls
    `wait_for_inputs(PDL)` at its top level, and nothing before that call loads, stores or returns
    (also inside the module's helpers it calls). A load before the wait would read the previous
    kernel's output while it is still being written; a return before it would let the next kernel
    start early. Every launch that passes ``launch_pdl`` passes the same value as ``PDL``."""
    tree = ast.parse(inspect.getsource(module))
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    kernels = [f for f in functions.values() if "PDL" in [a.arg for a in f.args.args]]
    assert kernels, module.__name__
    for kernel in kernels:
        waits = [i for i, stmt in enumerate(kernel.body) if _waits(stmt)]
        assert len(waits) == 1, f"{kernel.name} calls wait_for_inputs(PDL) {len(waits)} times at its top level"
        before = kernel.body[:waits[0]]
        ops = [op for stmt in before for op in _memory_ops(stmt, functions, set())]
        assert not ops, f"{kernel.name} accesses memory before wait_for_inputs: {ops}"
    launches = [c for c in ast.walk(tree) if isinstance(c, ast.Call) and any(k.arg == "launch_pdl" for k in c.keywords)]
    assert launches, module.__name__
    for call in launches:
        kw = {k.arg: ast.dump(k.value) for k in call.keywords}
        assert kw.get("PDL") == kw["launch_pdl"], f"line {call.lineno}: launch_pdl and PDL differ"


def _layer_chain(h, w_qkv, w_o, w_gate_up, w_down, norm_w, k_cache, v_cache, tables, positions, cos_sin):
    """A decode layer's kernel chain, each kernel reading the one before's output: qkv-shaped
    linear, RoPE + K/V scatter, decode attention, linear, residual norm, SwiGLU linear, split-K
    linear, residual norm (and the last two fused: the norm adding the split-K partials). Returns
    every intermediate the chain writes."""
    b = h.shape[0]
    qkv = gemm.linear(h, w_qkv)
    q, k, v = (qkv.view(b, 3, 2, 64)[:, i] for i in range(3))
    slots = (tables[0, :, 0].long() * k_cache.shape[1] + positions).contiguous()
    q_rot = kv_cache.rope_kv_scatter(q.contiguous(), k.contiguous(), v.contiguous(), positions, cos_sin, k_cache,
                                     v_cache, slots)
    seq_lens = (positions + 1).to(torch.int32)
    qsl = torch.arange(b + 1, dtype=torch.int32, device=h.device)
    attn = attention.paged_attention(q_rot, k_cache, v_cache, tables, seq_lens, qsl, decode_from=0).view(b, -1)
    o = gemm.linear(attn, w_o)
    r, n = norms.residual_norm(o, h[:, :128], norm_w, norm_w, 1e-6)
    act = gemm.linear(n, w_gate_up, activation="swiglu")
    down = gemm.linear(act, w_down)
    r2, n2 = norms.residual_norm(down, r, norm_w, norm_w, 1e-6)
    r3, n3 = linear_norm.linear_residual_norm(act, w_down, r, norm_w, norm_w, 1e-6)
    return qkv, q_rot, attn, o, r, n, act, down, r2, n2, r3, n3


@pytest.mark.gpu
@pytest.mark.parametrize("b", [8, 512], ids=["one wave", "many waves"])
def test_gpu_pdl_chain_in_a_graph_equals_stream_order(device, monkeypatch, b):
    """The chain captured in a CUDA graph with dependent launches (the engine's decode step) gives
    the bits of the same chain launched in plain stream order, replay after replay with new
    inputs: a kernel that read its input before `wait_for_inputs` would see stale values. At 512
    rows the norms and the decode attention (1024 programs) launch many programs per SM."""
    gen = seeded(7, device)
    hidden, k_deep = 384, gemm.SPLIT_MIN_K
    w_qkv = randn((hidden, hidden), torch.bfloat16, device, gen, scale=hidden**-0.5)
    w_o = randn((128, 128), torch.bfloat16, device, gen, scale=128**-0.5)
    w_gate_up = randn((2 * k_deep, 128), torch.bfloat16, device, gen, scale=128**-0.5)
    w_down = randn((128, k_deep), torch.bfloat16, device, gen, scale=k_deep**-0.5)
    norm_w = randn((128,), torch.bfloat16, device, gen) + 1
    blocks, block = 4 * b, 16
    tables = torch.arange(blocks, dtype=torch.int32, device=device).view(1, b, 4)
    cos_sin = norms.rope_cos_sin(256, 64, 10000.0, device=device)
    caches = [torch.zeros(blocks, block, 2, 64, dtype=torch.bfloat16, device=device) for _ in range(2)]
    h = torch.empty(b, hidden, dtype=torch.bfloat16, device=device)
    positions = torch.empty(b, dtype=torch.int64, device=device)

    def inputs(i):
        g = seeded(100 + i, device)
        h.copy_(randn((b, hidden), torch.bfloat16, device, g))
        positions.copy_(torch.randint(0, 4 * block, (b,), device=device, generator=g))
        for c in caches:
            c.copy_(randn(tuple(c.shape), torch.bfloat16, device, g))

    def chain():
        return _layer_chain(h, w_qkv, w_o, w_gate_up, w_down, norm_w, *caches, tables, positions, cos_sin)

    monkeypatch.setenv("RLT_PDL", "0")
    expected = []
    for i in range(6):
        inputs(i)
        expected.append([t.clone() for t in chain()] + [c.clone() for c in caches])
    monkeypatch.delenv("RLT_PDL")
    inputs(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain()
    for i in range(6):
        inputs(i)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(list(outs) + caches, expected[i]):
            assert torch.equal(got, want), f"replay {i}: a dependent launch changed a result"
        assert torch.equal(outs[10], outs[8]) and torch.equal(outs[11], outs[9]), "fused split-K sum changed the bits"
