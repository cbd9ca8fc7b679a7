import torch
from perf.sm90_resources import compile_sm90
from rlt_kernels import attention
ptrs = {"q_ptr": "*bf16", "out_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16"}
ptrs.update({n: "*i32" for n in ("tables_ptr", "seq_lens_ptr", "qsl_ptr", "slots_ptr", "qdepth_ptr",
                                 "key_depth_ptr", "active_ptr", "decode_from_ptr")},
            ws_ptr="*fp32", k_scale_ptr="*fp32", v_scale_ptr="*fp32")
flags = dict(BLOCK_SIZE=16, HAS_ACTIVE=True, HAS_SLOTS=True, QDEPTH_TENSOR=True, HAS_KEY_DEPTH=True,
             DECODE_FROM_TENSOR=True, KV_FP8=False, PDL=True, KV_ALIGNED=True)
for rows, warps, stages in ((64, 4, 3), (128, 8, 2), (128, 8, 3), (128, 4, 2)):
    attention.MIN_TILE_ROWS = rows
    cfg = attention._tile_shape(16, 16, 128, torch.bfloat16, False)
    cfg.pop("num_warps"); cfg.pop("num_stages")
    const = dict(cfg, BLOCK_N=attention.KEY_TILE, DOT_PRECISION="tf32", EXACT_DOT=False, WIDEN_INLINE=True, **flags)
    r = compile_sm90(attention._paged_attention_kernel, ptrs, const, floats=("qk_scale",), num_warps=warps, num_stages=stages)
    print(rows, warps, stages, {k: v for k, v in r.items() if k != "ptx"} if isinstance(r, dict) else r)
