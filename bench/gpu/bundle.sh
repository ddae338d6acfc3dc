#!/bin/bash
# Build .gpu-bundle/ (≈ 59 MiB, carried to the offline GPU machine with the repository):
# vLLM 0.24.0 for Python 3.12 + torch 2.11 + CUDA 13 (shared/reference/gpu-h200), plus
# ocrd's own dependencies and what `vllm serve` needs beyond the offline engine.
# Run where pip works, from the repository root:  bash bench/gpu/bundle.sh [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${1:-/tmp/gpu-bundle-work}
REF=${GPU_REFERENCE:-/work/shared/reference/gpu-h200}
TRANSFORMERS_PY=${TRANSFORMERS_PY:-$PWD/.venv/bin/python} bash "$REF/build_carry.sh" "$WORK" "$PWD/.gpu-bundle"  # absolute: it cds into WORK
mkdir -p .gpu-bundle/owhl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .gpu-bundle/owhl \
  structlog==26.1.0 watchdog==7.1.0 pypdfium2==5.15.2 pdf2image==1.17.0 \
  uvicorn==0.54.0 prometheus-fastapi-instrumentator==8.1.0 watchfiles==1.3.0 \
  model-hosting-container-standards==0.1.16 jmespath==1.1.0 supervisor==4.3.0 \
  opentelemetry-api==1.45.2 nh3==0.3.8
# py-spy (where the engine core's time goes: bench/gpu/run.py --profile) only when asked: with
# it the bundle and the tree pass the 64 MiB a device call may carry
if [ -n "${WITH_PYSPY:-}" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu-bundle/owhl py-spy==0.4.3
fi
du -sh .gpu-bundle
