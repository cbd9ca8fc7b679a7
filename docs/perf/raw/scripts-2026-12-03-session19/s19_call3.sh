# Session 19, call 3: where the GPU suite hangs after its last test (stacks of every process left).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 PYTHONFAULTHANDLER=1
python3 -m pytest tests -m gpu -n 8 -q -p no:cacheprovider -rfE --tb=short --durations=30 > $OUT/gpu_tests.log 2>&1 &
P=$!
for i in $(seq 1 75); do sleep 5; kill -0 $P 2>/dev/null || break; done
echo "alive after loop: $(kill -0 $P 2>/dev/null && echo yes || echo no)" >> $OUT/gpu_tests.log
ps -eo pid,ppid,etimes,stat,args --forest | grep -v "ps -eo" > $OUT/ps.txt
for c in $(pgrep -P $P); do for g in $(pgrep -P $c); do echo "grandchild $g of $c: $(cat /proc/$g/cmdline | tr '\0' ' ' | cut -c1-200)" >> $OUT/ps.txt; kill -ABRT $g; done; kill -ABRT $c; done
sleep 4; kill -ABRT $P; sleep 3; kill -9 $P 2>/dev/null
tail -c 20000 $OUT/gpu_tests.log | grep -v "^  File.*site-packages" | tail -150
