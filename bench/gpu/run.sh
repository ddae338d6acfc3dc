#!/bin/bash
# The GPU benchmark from one command, on the GPU machine, from the repository root:
#     bash bench/gpu/run.sh                  # managed, inproc, offline, then the report
#     bash bench/gpu/run.sh offline          # some phases only (EXTRA="--restart" etc.)
#     bash bench/gpu/run.sh multi [ARGS]     # bench/gpu/multi.py ARGS: 1 vs 2 servers/GPU
#     bash bench/gpu/run.sh moe [ARGS]       # bench/gpu/moe_tune.py ARGS: fused-MoE tiles
#     bash bench/gpu/run.sh steady [ARGS]    # bench/gpu/steady.py --gpu ARGS: fixed arrival rates
# The machine needs Python 3.12 + torch 2.11 (CUDA 13) and the carried bundle
# .gpu-bundle/ (bench/gpu/bundle.sh builds it where pip works): vLLM 0.24.0 and the
# wheels that machine lacks. Results: $OUT (default /tmp/gpu-out): results_*.json,
# log_*.txt, daemon_*.log, report.md.
set -o pipefail
cd "$(dirname "$0")/../.."
B=${GPU_BUNDLE:-.gpu-bundle}
W=${GPU_WORK:-/root/w}
OUTD=${OUT:-/tmp/gpu-out}
mkdir -p "$OUTD" "$W/bench"
if [ ! -f "$W/.installed" ]; then
  t0=$(date +%s)
  rm -rf "$W/site" && mkdir -p "$W/site"
  xz -T0 -dc "$B/vllm_pkg.tar.xz" | tar -xf - -C "$W/site" || { echo "UNTAR FAILED"; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$W/site" "$B"/whl/*.whl 2>&1 | grep -v -i warning
  touch "$W/.installed"
  echo "INSTALL $(( $(date +%s) - t0 )) s"
fi
# ocrd's own dependencies and what `vllm serve` needs beyond the offline engine (again
# on a warm machine: the list may have grown)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$W/site" "$B"/owhl/*.whl 2>&1 | grep -v -i warning
# ocrd is not pip-installed here: its vLLM plugin (the fast encoder) is found through a
# .dist-info with the entry point of pyproject.toml
DI="$W/site/ocrd_vllm_plugin-0.dist-info"
mkdir -p "$DI"
printf 'Metadata-Version: 2.1\nName: ocrd-vllm-plugin\nVersion: 0\n' > "$DI/METADATA"
printf '[vllm.general_plugins]\nocrd_fast_encoder = ocrd.vllm_model.plugin:register\n' \
  > "$DI/entry_points.txt"
[ -d /usr/local/nvidia/bin ] && export PATH="$PATH:/usr/local/nvidia/bin"  # nvidia-cuda-mps-control (MPS)
export PYTHONPATH="$W/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 VLLM_DO_NOT_TRACK=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$OUTD/gpu.txt"
echo "cores $(nproc); $(python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__)')" \
  | tee -a "$OUTD/gpu.txt"
python3 bench/gpu/run.py model --work "$W/bench" || exit 1
python3 bench/gpu/check.py "$W/bench/model" 2>&1 | grep "SERVE CHECK" || exit 1
if [ "${1:-}" = moe ]; then  # bench/gpu/moe_tune.py: the fused-MoE kernel's tiles for this GPU
  shift
  t0=$(date +%s)
  timeout --kill-after=30 "${MOE_LIMIT:-300}" python3 bench/gpu/moe_tune.py --out "$OUTD/moe" "$@" \
    > "$OUTD/log_moe.txt" 2>&1
  echo "MOE rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "^MOE|Traceback|Error" "$OUTD/log_moe.txt" | cut -c1-400 | tail -n 40
  exit 0
fi
if [ "${1:-}" = multi ]; then  # bench/gpu/multi.py: 1 vs 2 servers per GPU (and GPUs)
  shift
  t0=$(date +%s)
  timeout --kill-after=60 "${MULTI_LIMIT:-560}" python3 bench/gpu/multi.py --work "$W/bench" \
    --out "$OUTD" "$@" > "$OUTD/log_multi.txt" 2>&1
  echo "MULTI rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "^(ROW|\|)|Traceback|Error" "$OUTD/log_multi.txt" | cut -c1-900 | tail -n 30
  python3 bench/gpu/run.py cleanup --work "$W/bench"
  gzip -f "$OUTD"/daemon_multi_*.log 2>/dev/null
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  exit 0
fi
if [ "${1:-}" = steady ]; then  # bench/gpu/steady.py: files arriving at fixed rates
  shift
  t0=$(date +%s)
  timeout --kill-after=60 "${STEADY_LIMIT:-560}" python3 bench/gpu/steady.py --gpu --work "$W/bench" \
    --out "$OUTD/steady.json" "$@" > "$OUTD/log_steady.txt" 2>&1
  echo "STEADY rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "^STEADY|Traceback|Error" "$OUTD/log_steady.txt" | cut -c1-900 | tail -n 30
  python3 bench/gpu/run.py cleanup --work "$W/bench"
  gzip -c "$W/bench/steady/daemon/daemon.log" > "$OUTD/daemon_steady.log.gz" 2>/dev/null
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  exit 0
fi
PHASES=${*:-managed inproc offline}
for ph in $PHASES; do
  case $ph in
    managed) limit=${MANAGED_LIMIT:-560} ;;  # ~480 s, +130 s with EXTRA=--restart
    inproc) limit=${INPROC_LIMIT:-260} ;;
    offline) limit=${OFFLINE_LIMIT:-480} ;;
    *) limit=300 ;;
  esac
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout --kill-after=60 "$limit" python3 bench/gpu/run.py "$ph" --work "$W/bench" --out "$OUTD" \
    $EXTRA > "$OUTD/log_$ph.txt" 2>&1
  echo "PHASE $ph rc=$? $(( $(date +%s) - t0 )) s"
  grep -E "^(ROW|READY|RESTART|FRONTEND|ENGINE)|Traceback|Error" "$OUTD/log_$ph.txt" | cut -c1-600 | tail -n 25
  python3 bench/gpu/run.py cleanup --work "$W/bench"
done
python3 bench/gpu/run.py report --out "$OUTD"
