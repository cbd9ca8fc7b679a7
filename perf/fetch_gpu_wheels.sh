#!/usr/bin/env bash
# Download the Python packages the GPU suite and benchmarks need but the GPU image lacks, as
# Python 3.12 manylinux wheels, into ./.whl (git-ignored). On the GPU machine install them with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl  # one version of each package: pip refuses two
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pytest pluggy iniconfig packaging hypothesis sortedcontainers attrs pytest-benchmark py-cpuinfo \
  fastapi starlette uvicorn h11 click prometheus-client httpx httpcore anyio sniffio idna certifi \
  pydantic pydantic-core annotated-types typing-inspection typing-extensions annotated-doc \
  opentelemetry-api importlib-metadata zipp pytest-xdist execnet nvidia-cudnn-frontend xgrammar apache-tvm-ffi
