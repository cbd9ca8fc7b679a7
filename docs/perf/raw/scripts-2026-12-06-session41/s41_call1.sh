#!/usr/bin/env bash
# Session 41 call 1: c021/c038 under background load without the fix (old-*, /tmp/old) and with it, c038's
# failed-run tape on an idle GPU; then the GPU suite beside the 72-case matrix (PARTS=conformance: the
# matrix alone, PARTS=none: neither, for a call with little device time left).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
mkdir -p /tmp/old && cp -r rlt_runtime rlt_kernels perf scratch /tmp/old/ && (cd /tmp/old && patch -s -R -p1 < scratch/s41_verify_unfused.patch) && echo "old tree ready"
T0=$(date +%s)
python3 scratch/s41_variants.py /tmp/v ${VARIANT_BUDGET:-110}
pkill -f s40_load.py
echo "variants $(( $(date +%s) - T0 )) s"
[ "${PARTS:-tests}" != none ] && PART_TIMEOUT=${PART_TIMEOUT:-280} WORKERS=6 CONF_CASES=72 CONF_WORKERS=8 \
  CONF_BUDGET=${CONF_BUDGET:-260} CONF_TIMEOUT=${CONF_TIMEOUT:-290} bash perf/run_gpu.sh ${PARTS:-tests}
echo "total $(( $(date +%s) - T0 )) s"
