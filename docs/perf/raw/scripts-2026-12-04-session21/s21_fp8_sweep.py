"""FP8 decode attention: words vs per-byte cast, key tiles in flight (bit-neutral) at engine shapes."""
import json, sys, torch
from perf.conftest import cuda_time_ms
from perf import bench_decode_attention as B
from rlt_kernels import attention
rows = []
aligned = attention._kv_rows_aligned
for batch, keys in [(1, 192), (16, 192), (64, 192), (256, 192), (256, 1024), (64, 4096), (16, 32768)]:
    c = B.fp8_case(B.engine_case(batch, keys))
    ref = None
    for path in ("words", "bytes"):
        attention._kv_rows_aligned = aligned if path == "words" else (lambda cache: False)
        for tiles in (1, 2, 4):
            attention.DECODE_TILES = tiles
            attention.DECODE_TILES_SMALL_LAUNCH = tiles
            out = torch.empty_like(c["q"])
            ms = cuda_time_ms(B.rlt_call(c, out, 0))
            bits = out.view(torch.int16).clone()
            ref = bits if ref is None else ref
            rows.append(dict(batch=batch, keys=keys, path=path, tiles=tiles, us=ms * 1e3,
                             same_bits=bool(torch.equal(bits, ref))))
            print(json.dumps(rows[-1]), flush=True)
    attention._kv_rows_aligned = aligned
    attention.DECODE_TILES, attention.DECODE_TILES_SMALL_LAUNCH = 1, 4
    del c
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
