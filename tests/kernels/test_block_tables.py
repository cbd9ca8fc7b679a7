"""cache_slots against its torch reference and against the slot arithmetic written out here.

Rows past the active count carry valid-looking metadata, so a kernel that read it would give
them a slot instead of -1. Runs under the Triton interpreter on CPU and on CUDA.
"""

import pytest
import torch

from rlt_kernels import block_tables as cs

from checks import seeded


def _tables(planes, slots, width, device, gen, holes=0.2):
    """Block tables with distinct blocks per entry and about `holes` of the entries unallocated (-1)."""
    blocks = torch.randperm(planes * slots * width, generator=torch.Generator().manual_seed(width)).view(planes, slots, width)
    hole = torch.rand((planes, slots, width), generator=torch.Generator().manual_seed(planes)) < holes
    return torch.where(hole, -1, blocks).to(torch.int32).to(device)


def _by_hand(tables, token_slots, positions, block_size, live):
    planes, _, width = tables.shape
    out = torch.full((planes, positions.shape[0]), -1, dtype=torch.int64)
    for p in range(planes):
        for i in range(live):
            slot, pos = int(token_slots[i]), int(positions[i])
            if pos // block_size < width and int(tables[p, slot, pos // block_size]) >= 0:
                out[p, i] = int(tables[p, slot, pos // block_size]) * block_size + pos % block_size
    return out


@pytest.mark.parametrize("live", [None, 0, 1, 130, 200])
@pytest.mark.parametrize("block_size", [16, 5])
def test_cache_slots_match_the_arithmetic(device, live, block_size):
    planes, slots, width, rows = 3, 9, 7, 200
    gen = seeded(block_size, device)
    tables = _tables(planes, slots, width, device, gen)
    token_slots = torch.randint(0, slots, (rows,), generator=gen, device=device, dtype=torch.int32)
    positions = torch.randint(0, width * block_size + 2 * block_size, (rows,), generator=gen, device=device)  # some past the table
    active = None if live is None else torch.tensor([live], dtype=torch.int32, device=device)
    got = cs.cache_slots(tables, token_slots, positions, block_size, active_rows=active)
    expected = _by_hand(tables.cpu(), token_slots.cpu(), positions.cpu(), block_size, rows if live is None else live)
    if live is None or live > 100:  # holes, and slots, are both exercised
        assert (expected[:, :100] == -1).any() and (expected[:, :100] >= 0).any()
    assert torch.equal(got.cpu(), expected)
    out = torch.full_like(got, 7)
    assert cs.cache_slots(tables, token_slots, positions, block_size, out=out, active_rows=active) is out
    assert torch.equal(out, got)
    assert torch.equal(cs.cache_slots_reference(tables, token_slots, positions, block_size, active_rows=active), got)


def test_cache_slots_rejects_bad_arguments(device):
    tables = torch.zeros((2, 3, 4), dtype=torch.int32, device=device)
    rows = torch.zeros(5, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="block_tables"):
        cs.cache_slots(tables[0], rows, rows.long(), 16)
    with pytest.raises(ValueError, match="positions"):
        cs.cache_slots(tables, rows, rows[:4].long(), 16)
    with pytest.raises(ValueError, match="block_size"):
        cs.cache_slots(tables, rows, rows.long(), 0)
    with pytest.raises(ValueError, match="out"):
        cs.cache_slots(tables, rows, rows.long(), 16, out=torch.empty((2, 5), dtype=torch.int32, device=device))
    assert cs.cache_slots(tables, rows[:0], rows[:0].long(), 16).shape == (2, 0)
