"""Counter-based uniforms in plain torch on any device (graph-safe, no host sync).

Bit-identical to `rlt_kernels.sampling.philox_words` / `philox_uniform`: Philox4x32-10 with key
(low, high 32 bits of the row key) and counter (index, position, stream, 0). 32-bit words live in
int64 tensors; products wrap modulo 2^64, and masking recovers the high and low halves.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85


def philox_uniform_torch(keys: torch.Tensor, positions: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """keys, positions: int64 [M] on the target device -> fp32 [M, n] uniforms in (0, 1)."""
    m = keys.shape[0]
    dev = keys.device
    c0 = torch.arange(n, dtype=torch.int64, device=dev).expand(m, n)
    c1 = (positions.to(torch.int64) & _M32)[:, None].expand(m, n)
    c2 = torch.full((m, n), stream & _M32, dtype=torch.int64, device=dev)
    c3 = torch.zeros((m, n), dtype=torch.int64, device=dev)
    k0 = (keys & _M32)[:, None]
    k1 = ((keys >> 32) & _M32)[:, None]
    for _ in range(10):
        pb = c2 * _ROUND_B
        pa = c0 * _ROUND_A
        c0, c1, c2, c3 = ((pb >> 32) & _M32) ^ c1 ^ k0, pb & _M32, ((pa >> 32) & _M32) ^ c3 ^ k1, pa & _M32
        k0 = (k0 + _KEY_A) & _M32
        k1 = (k1 + _KEY_B) & _M32
    # ((x >> 9) + 0.5) * 2^-23: exact in fp32, like the reference and the Triton twin.
    return ((c0 >> 9).to(torch.float32) + 0.5) * 2.0**-23
