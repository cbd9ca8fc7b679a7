"""Host→device staging: fields land where the device views read them, and a host bank is never
refilled while its previous copy may still be queued behind device work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlt_runtime.executor.staging import StaticStaging


def test_fields_upload_into_stable_device_views():
    st = StaticStaging({"a": (torch.int32, 3), "b": (torch.int64, 2), "c": (torch.float32, 1)}, torch.device("cpu"))
    views = [st["a"], st["b"], st["c"]]
    for step in range(3):
        st.write("a", np.array([step, step + 1, step + 2]))
        st.write("b", np.array([10 * step, -step]))
        st.write("c", np.array([0.5 * step]))
        st.upload()
        assert st["a"].tolist() == [step, step + 1, step + 2] and st["b"].tolist() == [10 * step, -step]
        assert st["c"].tolist() == [0.5 * step]
    assert all(v.data_ptr() == st[k].data_ptr() for v, k in zip(views, "abc"))
    with pytest.raises(ValueError, match="'a' holds 3 values"):
        st.write("a", np.arange(4))


@pytest.mark.gpu
def test_a_bank_waits_for_its_copy_when_the_device_runs_behind():
    """The device sleeps while the host stages six steps that read nothing back (as prefill
    chunks that sample no token): each step must still see its own values, not those of a later
    step written into the same pinned bank before the queued copy ran."""
    device = torch.device("cuda")
    st = StaticStaging({"x": (torch.int64, 4)}, device)
    seen = []
    torch.cuda._sleep(1 << 28)
    for step in range(6):
        st.write("x", np.full(4, step))
        st.upload()
        seen.append(st["x"].clone())
    torch.cuda.synchronize()
    assert [s.tolist() for s in seen] == [[step] * 4 for step in range(6)]
