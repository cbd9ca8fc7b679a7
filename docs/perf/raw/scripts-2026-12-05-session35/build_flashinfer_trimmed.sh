#!/usr/bin/env bash
# FlashInfer 0.7.2.post1 for a machine with no network: its paged-decode modules compiled here
# (nvcc 13.0, sm_90a) into the package's AOT folder, and the heavy subpackages the decode path never
# imports left out (a meta-path finder answers for them), so the tree fits the device's carry limit.
# Output: scratch/fi/flashinfer-trimmed.tgz (unpack into a folder on PYTHONPATH; needs apache-tvm-ffi
# and nvidia-ml-py, which the GPU image or .whl/ provide).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
pip download -q --no-deps flashinfer-python==0.7.2.post1 "apache-tvm-ffi==0.1.15.post2" nvidia-ml-py -d "$work/w"
python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-deps "$work"/w/*.whl
# The link step names -lcuda: an empty stand-in is enough (the modules call the runtime API only).
if [ ! -e /usr/local/cuda/lib64/stubs/libcuda.so ]; then
  mkdir -p /usr/local/cuda/lib64/stubs && echo > "$work/empty.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /usr/local/cuda/lib64/stubs/libcuda.so "$work/empty.c"
fi
FLASHINFER_WORKSPACE_BASE="$work/ws" FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda "$work/venv/bin/python" - <<'PY'
import torch
from flashinfer.jit.attention.modules import gen_batch_decode_module
for kv in (torch.bfloat16, torch.float8_e4m3fn):  # q bf16, out bf16, int32 indices, head dim 128, no RoPE/window/cap
    gen_batch_decode_module(torch.bfloat16, kv, torch.bfloat16, torch.int32, 128, 128, 0, False, False).build()
PY
site=$("$work/venv/bin/python" -c "import flashinfer, os; print(os.path.dirname(os.path.dirname(flashinfer.__file__)))")
mkdir -p "$work/out"
tar -C "$site" --exclude=flashinfer/data --exclude=__pycache__ --exclude=flashinfer/experimental \
  --exclude=flashinfer/fused_moe --exclude=flashinfer/moe_ep --exclude=flashinfer/gdn_kernels \
  --exclude=flashinfer/cute_dsl/attention --exclude=flashinfer/cute_dsl/sparse -cf - flashinfer | tar -xf - -C "$work/out"
fi_dir="$work/out/flashinfer"
mkdir -p "$fi_dir/data/csrc" && cp "$site"/flashinfer/data/csrc/batch_decode* "$fi_dir/data/csrc/"
for so in $(find "$work/ws" -name "*.so"); do
  n=$(basename "$so" .so); mkdir -p "$fi_dir/data/aot/$n"; cp "$so" "$fi_dir/data/aot/$n/"
done
cp "$here/flashinfer_trimmed_finder.py" "$fi_dir/_trimmed.py"
sed -i '1i from . import _trimmed  # noqa: F401  (this tree left heavy optional subpackages out)' "$fi_dir/__init__.py"
mkdir -p "$here/../fi" && tar -czf "$here/../fi/flashinfer-trimmed.tgz" -C "$work/out" flashinfer
echo "wrote $here/../fi/flashinfer-trimmed.tgz"
