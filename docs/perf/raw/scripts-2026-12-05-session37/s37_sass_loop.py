"""The decode kernel compiled for sm_90: registers and key-loop SASS (see README.md for the flags)."""
import re, sys
import triton
from triton.compiler import ASTSource
from perf import sm90_resources as R
from rlt_kernels import attention

def compile_decode(cache="fp8", rope=False, key_depth=False, maxnreg=96, split=False, shape=(16, 16, 128)):
    ptrs, flags = R._attention_signature(cache)
    flags["HAS_KEY_DEPTH"] = key_depth
    cfg = attention._decode_shape(*shape)
    warps = cfg.pop("num_warps")
    tiles = attention.decode_tiles(cache == "fp8", small=split)
    const = dict(cfg, SPLIT=split, TILES=tiles, MERGE_IN_PLACE=split, WIDEN_INLINE=True, **flags, ROPE=rope,
                 GPTJ=False, HAS_Q_BIAS=False, HAS_K_BIAS=False, UNFUSED=rope)
    fn = attention._decode_attention_kernel
    names = fn.arg_names
    signature = {n: ptrs.get(n) or ("constexpr" if n in const else "fp32" if n == "qk_scale" else "i32") for n in names}
    plain = set(const) | {"qk_scale"} | set(getattr(fn, "do_not_specialize", ()))
    divisible = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n not in plain}
    src = ASTSource(fn=fn, signature=signature, constexprs={(names.index(n),): v for n, v in const.items()}, attrs=divisible)
    opts = {"enable_fp_fusion": True, "num_warps": warps, "num_stages": attention.DECODE_STAGES}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(src, target=R.TARGET, options=opts)

if __name__ == "__main__":
    cache = sys.argv[1] if len(sys.argv) > 1 else "fp8"
    k = compile_decode(cache, rope="rope" in sys.argv, key_depth="kd" in sys.argv, maxnreg=0 if "nocap" in sys.argv else 96, split="split" in sys.argv, shape=(55, 55, 96) if "huginn" in sys.argv else (16, 16, 128))
    sass = R._cuobjdump(k.asm["cubin"], "-sass")
    print(R._resources(k.asm["cubin"]), R._innermost_loop(k.asm["cubin"])["instructions"])
    if "dump" in sys.argv:
        lines = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
        loops = [(int(m.group(1), 16), a) for a, t in lines for m in [re.search(r"BRA.*?0x([0-9a-f]+)", t)] if m and int(m.group(1), 16) < a]
        s, e = min((l for l in loops if (l[1] - l[0]) // 16 > 50), key=lambda l: l[1] - l[0])
        for a, t in lines:
            if s <= a <= e:
                print(hex(a), t)
