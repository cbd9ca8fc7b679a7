# Session 31: engines at batch 64 / 256 (three runs each, heaps frozen), KVT 1 and 2.
for kvt in 1 2; do
  timeout 195 python3 -c "
import sys
from rlt_kernels import attention as A
A.DECODE_KV_HEADS_PER_PROGRAM = $kvt
from perf import bench_fp8
bench_fp8.main(['--out', '$OUT/fp8_kvt$kvt', '--parts', 'speed', '--batches', '64', '256', '--configs', 'bf16', 'w8a8 + KV'])
" > $OUT/fp8_kvt$kvt.log 2>&1; echo "kvt=$kvt rc=$?"
  grep -E "^\||rc=|Error" $OUT/fp8_kvt$kvt.log | cut -c1-300 | tail -20
done
