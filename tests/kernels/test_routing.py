"""gather_rows, scatter_rows and finalize_last_exited against their torch references and
against plain indexing written here.

Outputs and destinations start poisoned: rows the kernel must not touch keep their exact
bits, copied rows are bit-exact. Rows past the active count carry valid-looking but wrong
metadata, so a kernel that read it would write visibly. Runs under the Triton interpreter on
CPU; `gpu` tests add tensors past 2^31 elements.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_kernels import routing

from checks import assert_same_bits, seeded


def _rows(shape, dtype, device, gen):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, device=device).to(dtype)
    return torch.randint(-(2**40) if dtype == torch.int64 else -(2**30), 2**30, shape, generator=gen, device=device,
                         dtype=dtype)


def _poisoned(shape, dtype, device):
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -12345, dtype=dtype, device=device)


def _active(count, device):
    return None if count is None else torch.tensor([count], dtype=torch.int32, device=device)


def _distinct(num, count, gen, negatives=()):
    """count distinct indices below num (CPU), with the given positions set to -1."""
    seed = int(torch.randint(0, 2**31, (1,), generator=gen, device=gen.device))
    index = torch.randperm(num, generator=torch.Generator().manual_seed(seed))[:count]
    for i in negatives:
        index[i] = -1
    return index


def _garbage_past(index, live, num):
    """Past the active count: valid indices that live rows do not use."""
    used = set(index[:live].tolist())
    free = [i for i in range(num) if i not in used]
    for j, i in enumerate(range(live, index.shape[0])):
        index[i] = free[j % len(free)]
    return index


# -------------------------------------------------------------------------------- gather/scatter

ROW_CASES = [
    ((), torch.int64),  # token ids
    ((), torch.int32),  # positions
    ((37,), torch.bfloat16),
    ((1500,), torch.bfloat16),  # two column tiles
    ((300,), torch.float32),
    ((3, 5), torch.float16),
]


def _plain_gather(src, index, live, out_dtype):
    out = torch.zeros((index.shape[0],) + tuple(src.shape[1:]), dtype=out_dtype, device=src.device)
    for i in range(live):
        if index[i] >= 0:
            out[i] = src[index[i]].to(out_dtype)
    return out


@pytest.mark.parametrize("row_shape,dtype", ROW_CASES)
@pytest.mark.parametrize("active", [None, 5])
def test_gather_rows_matches_reference_and_indexing(device, row_shape, dtype, active):
    gen = seeded(len(row_shape) * 100 + dtype.itemsize + (active or 0), device)
    num_src, m = 12, 9
    src = _rows((num_src,) + row_shape, dtype, device, gen)
    live = m if active is None else active
    index = _garbage_past(_distinct(num_src, m, gen, negatives=(2, 7)), live, num_src).to(device)
    out = _poisoned((m,) + row_shape, dtype, device)
    assert routing.gather_rows(src, index, out=out, active_rows=_active(active, device)) is out
    assert_same_bits(out, routing.gather_rows_reference(src, index, active_rows=_active(active, device)))
    assert_same_bits(out, _plain_gather(src, index, live, dtype))


def test_gather_rows_allocates_and_casts(device):
    gen = seeded(3, device)
    src = _rows((6, 10), torch.bfloat16, device, gen)
    index = torch.tensor([5, 0, -1, 3], dtype=torch.int32, device=device)
    out = routing.gather_rows(src, index)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 10)
    assert_same_bits(out, _plain_gather(src, index, 4, torch.bfloat16))
    wide = routing.gather_rows(src, index, out=_poisoned((4, 10), torch.float32, device))
    assert_same_bits(wide, _plain_gather(src, index, 4, torch.float32))


def test_gather_rows_strided_rows(device):
    """src rows are a column slice of a wider pool; out is a slice of a bigger buffer."""
    gen = seeded(4, device)
    pool = _rows((10, 64), torch.float32, device, gen)
    src = pool[:, 8:40]
    index = torch.tensor([9, -1, 0, 4, 4], device=device)
    buffer = _poisoned((7, 50), torch.float32, device)
    routing.gather_rows(src, index, out=buffer[1:6, 10:42])
    expected = _poisoned((7, 50), torch.float32, device)
    expected[1:6, 10:42] = _plain_gather(src, index, 5, torch.float32)
    assert_same_bits(buffer, expected)


@pytest.mark.parametrize("row_shape,dtype", ROW_CASES)
@pytest.mark.parametrize("active", [None, 4])
def test_scatter_rows_matches_reference_and_indexing(device, row_shape, dtype, active):
    gen = seeded(len(row_shape) * 10 + dtype.itemsize + (active or 0), device)
    num_dst, m = 13, 8
    src = _rows((m,) + row_shape, dtype, device, gen)
    live = m if active is None else active
    index = _garbage_past(_distinct(num_dst, m, gen, negatives=(1,)), live, num_dst).to(device)
    dst = _poisoned((num_dst,) + row_shape, dtype, device)
    expected = dst.clone()
    for i in range(live):
        if index[i] >= 0:
            expected[index[i]] = src[i]
    ref = routing.scatter_rows_reference(src, index, dst.clone(), active_rows=_active(active, device))
    result = routing.scatter_rows(src, index, dst, active_rows=_active(active, device))
    assert result is dst
    assert_same_bits(dst, ref)
    assert_same_bits(dst, expected)


def test_scatter_rows_strided_and_cast(device):
    gen = seeded(5, device)
    src = _rows((4, 20), torch.bfloat16, device, gen)
    pool = _poisoned((6, 30), torch.float32, device)
    index = torch.tensor([5, 0, -1, 2], device=device)
    routing.scatter_rows(src, index, pool[:, 5:25])
    expected = _poisoned((6, 30), torch.float32, device)
    for i, j in enumerate(index.tolist()):
        if j >= 0:
            expected[j, 5:25] = src[i].float()
    assert_same_bits(pool, expected)


def test_rows_reject_bad_layouts(device):
    src = torch.zeros((4, 6, 2), device=device)
    index = torch.zeros(4, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="contiguous rows"):
        routing.gather_rows(src.transpose(1, 2), index)
    with pytest.raises(ValueError, match="out must be"):
        routing.gather_rows(src, index, out=torch.zeros((4, 12), device=device))
    with pytest.raises(ValueError, match="index"):
        routing.scatter_rows(src, index[:3], torch.zeros_like(src))
    with pytest.raises(ValueError, match="index"):
        routing.gather_rows(src, index.float())


@settings(max_examples=30)
@given(
    num_src=st.integers(1, 20),
    m=st.integers(0, 20),
    width=st.sampled_from([1, 3, 8, 130]),
    active=st.one_of(st.none(), st.integers(-1, 22)),
    negative_every=st.integers(2, 6),
    seed=st.integers(0, 2**16),
)
def test_gather_scatter_property(device, num_src, m, width, active, negative_every, seed):
    """Gather then scatter back through the same index: live rows round-trip exactly."""
    gen = seeded(seed, device)
    m = min(m, num_src)
    src = _rows((num_src, width), torch.float32, device, gen)
    live = m if active is None else max(0, min(active, m))
    index = _garbage_past(_distinct(num_src, m, gen, negatives=range(0, m, negative_every)), live, num_src).to(device)
    gathered = routing.gather_rows(src, index, out=_poisoned((m, width), torch.float32, device),
                                   active_rows=_active(active, device))
    assert_same_bits(gathered, _plain_gather(src, index, live, torch.float32))
    dst = _poisoned((num_src, width), torch.float32, device)
    routing.scatter_rows(gathered, index, dst, active_rows=_active(active, device))
    live_index = index[:live][index[:live] >= 0]
    untouched = torch.ones(num_src, dtype=torch.bool, device=device)
    untouched[live_index] = False
    assert_same_bits(dst[live_index], src[live_index])
    assert torch.isnan(dst[untouched]).all()


@pytest.mark.gpu
def test_gather_scatter_rows_past_2_pow_31_elements(device):
    """A bf16 slot pool of more than 2^31 elements (~4.3 GB): rows near its end."""
    width = 2048
    num_slots = 2**31 // width + 64
    pool = torch.zeros((num_slots, width), dtype=torch.bfloat16, device=device)
    index = torch.tensor([num_slots - 1, 2**31 // width + 1, -1, num_slots - 40], device=device)
    rows = torch.randn((4, width), device=device).to(torch.bfloat16)
    routing.scatter_rows(rows, index, pool)
    for i in (0, 1, 3):
        assert_same_bits(pool[index[i]], rows[i])
    assert torch.count_nonzero(pool[: 2**31 // width]).item() == 0
    gathered = routing.gather_rows(pool, index)
    assert_same_bits(gathered, _plain_gather(pool, index, 4, torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("m,width,dtype", [(64, 2048, torch.bfloat16), (256, 5280, torch.bfloat16),
                                           (256, 5280, torch.float32), (4096, 1, torch.int64)])
def test_gather_scatter_model_shapes(device, m, width, dtype):
    gen = seeded(m + width, device)
    src = _rows((2 * m, width), dtype, device, gen)
    if width == 1:  # token ids: a 1-D row tensor
        src = src.squeeze(-1)
    index = torch.randperm(2 * m, device=device)[:m]
    index[::5] = -1
    active = _active(m - 3, device)
    out = routing.gather_rows(src, index, out=_poisoned((m,) + tuple(src.shape[1:]), dtype, device), active_rows=active)
    assert_same_bits(out, routing.gather_rows_reference(src, index, active_rows=active))
    dst, ref = _poisoned(src.shape, dtype, device), _poisoned(src.shape, dtype, device)
    routing.scatter_rows(out, index, dst, active_rows=active)
    routing.scatter_rows_reference(out, index, ref, active_rows=active)
    assert_same_bits(dst, ref)


# --------------------------------------------------------------------------------- finalize


def _finalize_case(device, seed, layers, planes, seqs, kvh, d, bs, max_blocks, m, dtype=torch.float32):
    """Multi-layer caches (random, distinct block per (plane, seq, logical block)) and m rows."""
    gen = seeded(seed, device)
    num_blocks = planes * seqs * max_blocks + 2
    k_cache = torch.randn((layers, num_blocks, bs, kvh, d), generator=gen, device=device).to(dtype)
    v_cache = torch.randn((layers, num_blocks, bs, kvh, d), generator=gen, device=device).to(dtype)
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    block_tables = perm[: planes * seqs * max_blocks].view(planes, seqs, max_blocks).to(torch.int32).to(device)
    tokens = torch.randperm(seqs * max_blocks * bs, generator=torch.Generator().manual_seed(seed + 1))[:m]
    seq_slots = (tokens // (max_blocks * bs)).to(device)
    positions = (tokens % (max_blocks * bs)).to(torch.int32).to(device)
    exit_planes = torch.randint(-1, planes, (m,), generator=gen, device=device)
    return k_cache, v_cache, block_tables, seq_slots, positions, exit_planes


def _plain_finalize(cache, block_tables, seq_slots, positions, exit_planes, live):
    """Expected cache, vectorised over layers with advanced indexing."""
    expected = cache.clone()
    bs = cache.shape[2]
    for i in range(live):
        e = int(exit_planes[i])
        if e < 0:
            continue
        s, p = int(seq_slots[i]), int(positions[i])
        src = block_tables[e, s, p // bs]
        dst = block_tables[e + 1:, s, p // bs]
        expected[:, dst.long(), p % bs] = cache[:, src.long(), p % bs].unsqueeze(1)
    return expected


@pytest.mark.parametrize("layers,planes,kvh,d,bs,dtype", [
    (2, 4, 2, 96, 16, torch.float32),
    (3, 3, 1, 64, 128, torch.bfloat16),
    (1, 5, 20, 128, 16, torch.float16),  # two head groups per token
])
@pytest.mark.parametrize("active", [None, 6])
def test_finalize_last_exited_matches_reference_and_indexing(device, layers, planes, kvh, d, bs, dtype, active):
    m = 9
    k_cache, v_cache, tables, seq_slots, positions, exit_planes = _finalize_case(
        device, layers * planes + kvh, layers, planes, 3, kvh, d, bs, 2, m, dtype
    )
    live = m if active is None else active
    exit_planes[0] = 0
    exit_planes[1] = -1
    exit_planes[live:] = 0  # rows past the count would copy if their metadata were read
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    k_plain = _plain_finalize(k_cache, tables, seq_slots, positions, exit_planes, live)
    v_plain = _plain_finalize(v_cache, tables, seq_slots, positions, exit_planes, live)
    routing.finalize_last_exited(k_cache, v_cache, tables, seq_slots, positions, exit_planes,
                                 active_rows=_active(active, device))
    routing.finalize_last_exited_reference(k_ref, v_ref, tables, seq_slots, positions, exit_planes,
                                           active_rows=_active(active, device))
    assert_same_bits(k_cache, k_ref)
    assert_same_bits(v_cache, v_ref)
    assert_same_bits(k_cache, k_plain)
    assert_same_bits(v_cache, v_plain)


def test_finalize_strided_layer_view_and_inert_rows(device):
    """Caches as a slice of a bigger pool; rows with exit plane -1 (garbage slots) copy nothing."""
    pool_k, pool_v, tables, seq_slots, positions, exit_planes = _finalize_case(device, 9, 4, 3, 2, 2, 64, 16, 2, 5)
    exit_planes[:] = torch.tensor([1, -1, 0, -1, 2])
    seq_slots[1] = 10**6  # never read: the row's exit plane is negative
    before_k, before_v = pool_k.clone(), pool_v.clone()
    routing.finalize_last_exited(pool_k[1:3], pool_v[1:3], tables, seq_slots, positions, exit_planes)
    assert_same_bits(pool_k[[0, 3]], before_k[[0, 3]])
    assert_same_bits(pool_v[[0, 3]], before_v[[0, 3]])
    seq_slots[1] = 0
    assert_same_bits(pool_k[1:3], _plain_finalize(before_k[1:3], tables, seq_slots, positions, exit_planes, 5))
    assert_same_bits(pool_v[1:3], _plain_finalize(before_v[1:3], tables, seq_slots, positions, exit_planes, 5))


@settings(max_examples=20)
@given(
    planes=st.integers(1, 4),
    m=st.integers(0, 8),
    active=st.one_of(st.none(), st.integers(-1, 9)),
    seed=st.integers(0, 2**16),
)
def test_finalize_property(device, planes, m, active, seed):
    k_cache, v_cache, tables, seq_slots, positions, exit_planes = _finalize_case(
        device, seed, 2, planes, 3, 1, 64, 16, 2, m
    )
    live = m if active is None else max(0, min(active, m))
    k_plain = _plain_finalize(k_cache, tables, seq_slots, positions, exit_planes, live)
    v_plain = _plain_finalize(v_cache, tables, seq_slots, positions, exit_planes, live)
    routing.finalize_last_exited(k_cache, v_cache, tables, seq_slots, positions, exit_planes,
                                 active_rows=_active(active, device))
    assert_same_bits(k_cache, k_plain)
    assert_same_bits(v_cache, v_plain)


@pytest.mark.gpu
def test_finalize_cache_past_2_pow_31_elements(device):
    """Two layers, 2^31+ elements per cache (~4.3 GB each): copies into the last blocks."""
    layers, kvh, d, bs = 2, 8, 128, 16
    num_blocks = 2**30 // (bs * kvh * d) + 8
    k_cache = torch.zeros((layers, num_blocks, bs, kvh, d), dtype=torch.bfloat16, device=device)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.tensor([[[0]], [[num_blocks - 1]], [[num_blocks - 2]]], dtype=torch.int32, device=device)
    k_cache[:, 0, 5] = torch.randn((layers, kvh, d), device=device).to(torch.bfloat16)
    v_cache[:, 0, 5] = torch.randn((layers, kvh, d), device=device).to(torch.bfloat16)
    one = torch.zeros(1, dtype=torch.int64, device=device)
    routing.finalize_last_exited(k_cache, v_cache, tables, one, one + 5, one)
    for cache in (k_cache, v_cache):
        for block in (num_blocks - 1, num_blocks - 2):
            assert_same_bits(cache[:, block, 5], cache[:, 0, 5])
        for chunk in cache[:, 1:num_blocks - 2].split(4096, dim=1):  # no 2^31-element temporaries
            assert not chunk.any()


@pytest.mark.gpu
def test_finalize_ouro_shape_bf16(device):
    """256 rows x 24 layers x 4 planes, 16 heads x 128, block size 16."""
    k_cache, v_cache, tables, seq_slots, positions, exit_planes = _finalize_case(
        device, 1, 24, 4, 256, 16, 128, 16, 2, 256, torch.bfloat16
    )
    active = _active(250, device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    routing.finalize_last_exited(k_cache, v_cache, tables, seq_slots, positions, exit_planes, active_rows=active)
    routing.finalize_last_exited_reference(k_ref, v_ref, tables, seq_slots, positions, exit_planes, active_rows=active)
    assert_same_bits(k_cache, k_ref)
    assert_same_bits(v_cache, v_ref)
