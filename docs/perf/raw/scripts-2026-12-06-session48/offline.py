import sys, os, json
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf.sm90_resources import compile_sm90
from persistent import persistent_decode
ptrs = {n: "*bf16" for n in ("h0", "qkv_buf", "attn_buf", "act_buf", "kc", "vc")}
ptrs.update({n: "*fp32" for n in ("hout", "sqkv", "so", "sgu", "sd", "norms", "fnorm", "cos_ptr", "sin_ptr", "at_m", "at_l", "at_acc", "o_part", "d_part")})
ptrs.update({n: "*fp8e4nv" for n in ("wqkv", "wo", "wgu", "wd", "xs")})
ptrs.update({"bar": "*i32", "head_cnt": "*i32", "amax_buf": "*i32"})
for ahead, stages, warps in [(0, 2, 4)]:
    ce = dict(H=2048, NH=16, HD=128, F=5632, L=24, LL=96, BN=64, BK=256, ROWS=16, STAGES=stages, KT=32, SMAX=8,
              AHEAD=ahead, O_SPLIT=4, D_SPLIT=4, D_RANGE=1536, EXACT=False, ONE_THREAD=True, SKIP=0)
    r = compile_sm90(persistent_decode, ptrs, ce, floats=("sm_scale", "eps"), num_warps=warps)
    print(ahead, stages, warps, json.dumps(r))
from persistent import barriers_only
print(compile_sm90(barriers_only, {"bar": "*i32"}, {"ONE_THREAD": True}))
