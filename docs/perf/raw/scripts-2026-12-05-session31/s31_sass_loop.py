"""Static sm_90 SASS of the unsplit FP8/bf16 decode kernel (Ouro 16 x 128, key-depth table), compiled
offline: registers and the key loop's instruction mix.  PYTHONPATH=.:<this folder> python3 s31_sass_loop.py fp8:4:2 bf16:4:1
(cache:warps:key tiles in flight)."""
import re, collections, subprocess, os, sys, json
import triton
from perf import sm90_resources as s
from rlt_kernels import attention

def loop_report(cache="fp8", warps=None, tiles=None):
    captured = {}
    real = triton.compile
    def grab(src, target=None, options=None):
        k = real(src, target=target, options=options); captured['k'] = k; return k
    s.triton.compile = grab
    ptrs = {"q_ptr": "*bf16", "out_ptr": "*bf16", "k_ptr": "*fp8e4nv" if cache == "fp8" else "*bf16",
            "v_ptr": "*fp8e4nv" if cache == "fp8" else "*bf16"}
    ptrs.update({n: "*i32" for n in ("tables_ptr", "seq_lens_ptr", "qsl_ptr", "slots_ptr", "qdepth_ptr",
                                     "key_depth_ptr", "active_ptr", "decode_from_ptr")},
                ws_ptr="*fp32", k_scale_ptr="*fp32", v_scale_ptr="*fp32", counters_ptr="*i32")
    flags = dict(BLOCK_SIZE=16, HAS_ACTIVE=True, HAS_SLOTS=True, QDEPTH_TENSOR=True, HAS_KEY_DEPTH=True,
                 DECODE_FROM_TENSOR=True, KV_FP8=cache == "fp8", PDL=True, KV_ALIGNED=True)
    cfg = attention._decode_shape(16, 16, 128); w = cfg.pop("num_warps")
    warps = warps or w
    tiles = tiles or attention.decode_tiles(cache == "fp8", False)
    rope_ptrs = dict(ptrs, rope_k_ptr="*bf16", rope_v_ptr="*bf16", pos_ptr="*i64", cos_sin_ptr="*fp32",
                     write_slot_ptr="*i64", q_bias_ptr="*bf16", k_bias_ptr="*bf16")
    extra = {}
    if "HEADS_INNER" in attention._decode_attention_kernel.arg_names:
        extra["HEADS_INNER"] = False
    r = s.compile_sm90(attention._decode_attention_kernel, rope_ptrs,
        dict(cfg, SPLIT=False, TILES=tiles, MERGE_IN_PLACE=False, WIDEN_INLINE=True, **flags, **extra,
             ROPE=False, GPTJ=False, HAS_Q_BIAS=False, HAS_K_BIAS=False, UNFUSED=False),
        floats=("qk_scale",), num_warps=warps, num_stages=1)
    s.triton.compile = real
    if "error" in r:
        return r
    k = captured['k']
    path = f"/tmp/s31/dec_{cache}_{warps}_{tiles}.cubin"
    open(path, 'wb').write(k.asm['cubin'])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True).stdout
    ins = []
    for l in sass.splitlines():
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
        if m: ins.append((int(m.group(1), 16), m.group(2).strip()))
    loops = []
    for addr, t in ins:
        m = re.search(r'BRA.*?0x([0-9a-f]+)', t)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    # the key loop: the innermost loop of more than 50 instructions
    inner = min((l for l in loops if (l[1] - l[0]) // 16 > 50), key=lambda l: l[1] - l[0])
    body = [t for a, t in ins if inner[0] <= a <= inner[1]]
    ops = collections.Counter(re.sub(r'^@!?U?P\w+\s+', '', t).split()[0] for t in body)
    threads = 32 * warps
    elems = tiles * 16 * 128 * 2 // threads  # K and V elements a thread holds per loop iteration
    return dict(cache=cache, warps=warps, tiles=tiles, registers=r.get("registers"), stack=r.get("stack_bytes"),
                loop_instructions=len(body), elements_per_thread=elems, per_element=round(len(body) / elems, 2),
                top=ops.most_common(12))

if __name__ == "__main__":
    for spec in sys.argv[1:]:
        cache, warps, tiles = spec.split(":")
        print(json.dumps(loop_report(cache, int(warps), int(tiles))))
