#!/usr/bin/env bash
# Session 37 call 3: the speculative reproducibility GPU test (failed once in call 2's eager run), this tree and main, alone.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
for i in 1; do
  for who in new main; do
    if [ $who = new ]; then dir=.; else dir=scratch/main_src; fi
    (cd $dir && timeout 100 python3 -m pytest "tests/runtime/test_speculative_reproducibility.py::test_reproducible_on_the_gpu[eager]" -m gpu -q -p no:cacheprovider -x 2>&1 | tail -25 > $OUT/spec_${who}_$i.log)
    echo "$who $i: $(tail -1 $OUT/spec_${who}_$i.log)"
  done
done
grep -h -E "^E |assert" $OUT/spec_new_*.log | head -20
(timeout 80 python3 -m pytest "tests/runtime/test_speculative_reproducibility.py::test_reproducible_on_the_gpu[eager]" -m gpu -q -p no:cacheprovider 2>&1 | tail -25 > $OUT/spec_new_2.log)
echo "new 2: $(tail -1 $OUT/spec_new_2.log)"
