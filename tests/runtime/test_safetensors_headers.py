"""Malformed safetensors headers raise CheckpointError naming the file and the entry, before any tensor.

Each file is written by hand: an 8-byte little-endian header length, the header JSON, the data.
The valid starting point is the checkpoint save_checkpoint writes for a one-layer Ouro config
small enough that its header has a handful of entries. The hypothesis tests mutate that header
(values, keys, offsets, raw bytes) and require that `iter_checkpoint` either raises
CheckpointError when it is called or streams every tensor without error: validation must catch
everything the safetensors library would refuse later.
"""

import json
import os
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_runtime.errors import CheckpointError
from rlt_runtime.models import checkpoint
from rlt_runtime.models.checkpoint import iter_checkpoint, save_checkpoint
from rlt_runtime.models.configs import OuroConfig, config_to_dict, hf_weight_shapes
from rlt_runtime.models.presets import preset_weights

CFG = OuroConfig(vocab_size=8, hidden_size=4, intermediate_size=4, num_hidden_layers=1, num_attention_heads=1,
                 num_key_value_heads=1, head_dim=4, max_position_embeddings=16, total_ut_steps=1)
ENTRY = "model.norm.weight"  # F32 [4]: 16 bytes


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """(header dict, data bytes) of a valid checkpoint of CFG."""
    path = tmp_path_factory.mktemp("valid")
    save_checkpoint(str(path), CFG, preset_weights(CFG, seed=0))
    blob = (path / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _write(directory, header, data: bytes):
    """A checkpoint directory holding config.json and model.safetensors with `header` (a dict or raw bytes)."""
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config_to_dict(CFG)))
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return str(directory)


def _refused(directory, *names):
    """iter_checkpoint raises CheckpointError naming model.safetensors and each of `names`."""
    with pytest.raises(CheckpointError) as err:
        iter_checkpoint(directory, CFG)
    message = str(err.value)
    assert "model.safetensors" in message, message
    for name in names:
        assert name in message, (name, message)
    return message


def _with(header, name, **changes):
    return {**header, name: {**header[name], **changes}}


def test_the_valid_file_streams(tmp_path, valid):
    header, data = valid
    loaded = dict(iter_checkpoint(_write(tmp_path / "ok", header, data), CFG))
    assert sorted(loaded) == sorted(hf_weight_shapes(CFG)) == sorted(header)


@pytest.mark.parametrize("case, changes, text", [
    ("offsets as strings", {"data_offsets": ["0", "16"]}, "data_offsets ['0', '16']"),
    ("one offset", {"data_offsets": [0]}, "data_offsets [0]"),
    ("float offsets", {"data_offsets": [0.0, 16.0]}, "data_offsets"),
    ("begin after end", {"data_offsets": [16, 0]}, "0 <= begin <= end"),
    ("negative offset", {"data_offsets": [-16, 0]}, "data_offsets"),
    ("dtype as a list", {"dtype": ["F32"]}, "has dtype ['F32']"),
    ("unknown dtype", {"dtype": "F7"}, "has dtype F7; weights must be one of"),
    ("integer dtype", {"dtype": "I32"}, "has dtype I32"),
    ("shape as a string", {"shape": "4"}, "has shape '4'"),
    ("boolean in shape", {"shape": [True, 4]}, "has shape [True, 4]"),
    ("negative shape", {"shape": [-4]}, "has shape [-4]"),
    ("shape and size differ", {"shape": [3]}, "do not match shape [3] and dtype F32"),
    ("extra key", {"note": 1}, "exactly the keys"),
])
def test_malformed_entry_is_named(tmp_path, valid, case, changes, text):
    header, data = valid
    _refused(_write(tmp_path / "m", _with(header, ENTRY, **changes), data), f"'{ENTRY}'", text)


def test_entry_not_an_object_or_missing_a_key(tmp_path, valid):
    header, data = valid
    _refused(_write(tmp_path / "a", {**header, ENTRY: [1, 2]}, data), f"'{ENTRY}'", "exactly the keys")
    entry = {k: v for k, v in header[ENTRY].items() if k != "shape"}
    _refused(_write(tmp_path / "b", {**header, ENTRY: entry}, data), f"'{ENTRY}'", "exactly the keys")


def test_deeply_nested_json_is_refused_without_recursion(tmp_path, valid):
    header, data = valid
    deep = json.dumps(_with(header, ENTRY, shape="@")).replace('"@"', "[" * 100_000 + "]" * 100_000)
    _refused(_write(tmp_path / "deep", deep.encode(), data), f"'{ENTRY}'", "nested deeper than the 3 levels")
    _refused(_write(tmp_path / "top", b"[" * 100_000 + b"]" * 100_000, data), "at the top level")
    # Brackets inside strings do not count.
    named = json.dumps({**header, "__metadata__": {"format": "[[[[{{{{"}}).encode()
    assert len(dict(iter_checkpoint(_write(tmp_path / "strings", named, data), CFG))) == len(hf_weight_shapes(CFG))


def test_a_shape_of_many_huge_dimensions_is_refused_at_once(tmp_path, valid):
    """The size check stops multiplying past the data size: 100k dimensions of 2**62 would
    otherwise build a product of millions of digits, one quadratic multiplication after another."""
    header, data = valid
    started = time.monotonic()
    _refused(_write(tmp_path / "huge", _with(header, ENTRY, shape=[2**62] * 100_000), data), f"'{ENTRY}'",
             "do not match shape")
    assert time.monotonic() - started < 5


def test_header_longer_than_the_file(tmp_path, valid):
    header, data = valid
    directory = _write(tmp_path / "long", header, data)
    path = os.path.join(directory, "model.safetensors")
    blob = open(path, "rb").read()
    open(path, "wb").write(struct.pack("<Q", len(blob)) + blob[8:])
    _refused(directory, f"header claims {len(blob)} bytes, file has {len(blob)}")


def test_header_over_the_safetensors_limit(tmp_path, valid, monkeypatch):
    header, data = valid
    monkeypatch.setattr(checkpoint, "MAX_HEADER_BYTES", 64)
    _refused(_write(tmp_path / "big", header, data), "more than the 64 safetensors allows")


def test_overlapping_gapped_and_out_of_range_offsets(tmp_path, valid):
    header, data = valid
    order = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    first, second = order[0], order[1]
    shifted = [header[second]["data_offsets"][0] - 4, header[second]["data_offsets"][1] - 4]
    _refused(_write(tmp_path / "overlap", _with(header, second, data_offsets=shifted), data),
             f"tensor '{second}'", f"overlaps tensor '{first}'")
    last = order[-1]
    lb, le = header[last]["data_offsets"]
    _refused(_write(tmp_path / "gap", _with(header, last, data_offsets=[lb + 4, le + 4]), data + b"\0" * 4),
             f"tensor '{last}'", "leaves a gap")
    _refused(_write(tmp_path / "beyond", _with(header, last, data_offsets=[lb + 4, le + 4]), data),
             f"tensor '{last}' ends at byte {le + 4}", f"only {len(data)} bytes")
    _refused(_write(tmp_path / "trailing", header, data + b"\0" * 8), f"has {len(data) + 8} bytes",
             f"cover {len(data)}")
    duplicate = {**header, "copy": dict(header[first])}
    _refused(_write(tmp_path / "shared", duplicate, data), "overlaps tensor")


def test_metadata_duplicate_keys_constants_and_encoding(tmp_path, valid):
    header, data = valid
    _refused(_write(tmp_path / "meta", {**header, "__metadata__": {"format": 1}}, data), "'__metadata__'")
    _refused(_write(tmp_path / "meta-list", {**header, "__metadata__": ["pt"]}, data), "'__metadata__'")
    raw = json.dumps(header)
    twice = raw[:-1] + ", " + json.dumps({ENTRY: header[ENTRY]})[1:]
    _refused(_write(tmp_path / "dup", twice.encode(), data), f"key '{ENTRY}' appears twice")
    nan = json.dumps(_with(header, ENTRY, shape="@")).replace('"@"', "[NaN]")
    _refused(_write(tmp_path / "nan", nan.encode(), data), "NaN is not JSON")
    _refused(_write(tmp_path / "bytes", raw.encode().replace(b'"dtype"', b'"\xff\xfe"', 1), data), "utf-8")
    _refused(_write(tmp_path / "array", b"[]", data), "not a JSON object")


def test_deeply_nested_config_json_is_a_checkpoint_error(tmp_path):
    from rlt_runtime.models.checkpoint import load_config

    (tmp_path / "config.json").write_text('{"model_type": "ouro", "id2label": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON \(nested too deeply\)"):
        load_config(str(tmp_path))


# ---- mutations of a valid header ----------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6)
    | st.sampled_from(["F32", "F16", "BF16", "I32", "F64"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated_headers(draw, header):
    """The valid header with one to three changes: values, keys, offsets (one end, or both), entries."""
    header = json.loads(json.dumps(header))
    names = sorted(header)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names + ["__metadata__", "extra"]))
        op = draw(st.sampled_from(["value", "delete", "offset", "shift", "entry", "add"]))
        entry = header.get(name)
        if op == "entry" or not isinstance(entry, dict):
            header[name] = draw(JSON)
        elif op == "delete" and entry:
            entry.pop(draw(st.sampled_from(sorted(entry))))
        elif op == "offset" and isinstance(entry.get("data_offsets"), list) and entry["data_offsets"]:
            i = draw(st.integers(0, len(entry["data_offsets"]) - 1))
            if isinstance(entry["data_offsets"][i], int):
                entry["data_offsets"][i] += draw(st.integers(-40, 40))
        elif op == "shift" and isinstance(entry.get("data_offsets"), list):
            step = draw(st.integers(-40, 40))
            entry["data_offsets"] = [o + step if isinstance(o, int) else o for o in entry["data_offsets"]]
        elif op == "add":
            entry[draw(st.text(max_size=4))] = draw(JSON)
        else:
            entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(JSON)
    return header


def _loads_or_refuses_up_front(directory):
    """Either iter_checkpoint raises CheckpointError, or every tensor streams without any error."""
    try:
        tensors = iter_checkpoint(directory, CFG)
    except CheckpointError:
        return
    assert len(list(tensors)) == len(hf_weight_shapes(CFG))


@settings(max_examples=150)
@given(data=st.data())
def test_mutated_header_raises_only_checkpoint_error(tmp_path_factory, valid, data):
    header, blob = valid
    mutated = data.draw(mutated_headers(header))
    _loads_or_refuses_up_front(_write(tmp_path_factory.mktemp("mut"), mutated, blob))


@settings(max_examples=150)
@given(data=st.data())
def test_corrupted_header_bytes_raise_only_checkpoint_error(tmp_path_factory, valid, data):
    header, blob = valid
    raw = bytearray(json.dumps(header).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        op = data.draw(st.sampled_from(["set", "insert", "delete"]))
        byte = data.draw(st.sampled_from(b'{}[]",:0123456789-. eE\\\xff') | st.integers(0, 255))
        if op == "set":
            raw[i] = byte
        elif op == "insert":
            raw.insert(i, byte)
        else:
            del raw[i]
    directory = tmp_path_factory.mktemp("bytes")
    path = _write(directory, bytes(raw), blob)
    if data.draw(st.booleans()):  # a wrong length prefix as well
        file = os.path.join(path, "model.safetensors")
        content = open(file, "rb").read()
        open(file, "wb").write(struct.pack("<Q", data.draw(st.integers(0, 2 * len(content)))) + content[8:])
    _loads_or_refuses_up_front(path)
