# Session 47: on an H200 only. main's tree (scratch/main): the FP8 engines against bf16, then the
# FP8 decode at one warp (constants flipped) against main at batch 256, alternating.
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || { echo "not an H200: nothing run"; exit 0; }
cd scratch/main
mkdir -p $OUT/fp8
timeout 400 python3 -m perf.bench_fp8 --out $OUT/fp8 --parts speed --repeats 2 --configs bf16 "w8a8 + KV" w8a8 --batches 1 256 > $OUT/fp8/fp8.log 2>&1
tail -n 12 $OUT/fp8/fp8.log
BATCHES=256 timeout $((590 - SECONDS)) python3 s46_engine_ab.py $OUT/ab.json main w1c0 main w1c0 > $OUT/ab.log 2>&1
tail -n 6 $OUT/ab.log
