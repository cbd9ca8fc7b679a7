"""Process-independent hashing for everything that feeds randomness or cache identity.

Python's `hash()` of a string (or of a tuple holding one) changes with PYTHONHASHSEED, so it
must never pick a random stream, a device key or a prefix-cache entry. `stable_hash` is
BLAKE2b over a canonical, type-tagged byte encoding: the same value in every process and
machine. The per-request random keys of the engine are defined here:

* ``sample_key(seed, i)``: sample i of a request with ``SamplingParams.seed = seed``.
* ``unseeded_key(engine_seed, arrival, i)``: sample i of the arrival-th unseeded request.
* ``prompt_key(engine_seed)``: Huginn's initial-state noise at prompt positions (the same for
  every request, so a prompt's K/V is a function of its tokens and can be shared).

All keys are non-negative 63-bit integers (they travel as int64 on the device).
"""

from __future__ import annotations

import hashlib
import struct
from array import array

MASK63 = (1 << 63) - 1
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _encode(value, out: list) -> None:
    """Append the tagged encoding of `value` (int, str, bytes, None, or a tuple/list of those)."""
    if isinstance(value, bool):
        raise TypeError("stable_hash does not take booleans (ambiguous with integers)")
    if isinstance(value, int):
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        out += [b"i", struct.pack("<I", len(raw)), raw]
    elif isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        out += [b"s", struct.pack("<I", len(raw)), raw]
    elif isinstance(value, bytes):
        out += [b"b", struct.pack("<I", len(value)), value]
    elif value is None:
        out.append(b"n")
    elif isinstance(value, (tuple, list)):
        if all(type(v) is int and _INT64[0] <= v <= _INT64[1] for v in value):
            # Fast path for token blocks: one int64 array.
            out += [b"a", struct.pack("<I", len(value)), array("q", value).tobytes()]
        else:
            out += [b"t", struct.pack("<I", len(value))]
            for v in value:
                _encode(v, out)
    else:
        raise TypeError(f"stable_hash cannot encode {type(value).__name__}")


def stable_hash(*parts) -> int:
    """Non-negative 63-bit hash of `parts`, identical in every process (see module docstring)."""
    out: list = []
    _encode(parts, out)
    return int.from_bytes(hashlib.blake2b(b"".join(out), digest_size=8).digest(), "little") & MASK63


def sample_key(seed: int, sample_index: int) -> int:
    """Row key of sample `sample_index` of a request with SamplingParams.seed = `seed`."""
    return stable_hash("rlt.sample", seed, sample_index)


def unseeded_key(engine_seed: int, arrival: int, sample_index: int) -> int:
    """Row key of sample `sample_index` of the `arrival`-th request (0-based) without a seed."""
    return stable_hash("rlt.unseeded", engine_seed, arrival, sample_index)


def prompt_key(engine_seed: int) -> int:
    """Noise key of every prompt position (Huginn's initial state), the same for all requests."""
    return stable_hash("rlt.prompt", engine_seed)
