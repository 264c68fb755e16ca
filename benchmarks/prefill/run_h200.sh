#!/usr/bin/env bash
# One device call (session 2 of issue 3): every GPU-marked kernel test, then the pages/rare sweep.
#   bash benchmarks/prefill/run_h200.sh        (on the GPU machine, repo root; logs under $OUT)
set -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OUT=${OUT:-.}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/env.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> "$OUT/env.txt"
start=$(date +%s)
timeout "${TEST_LIMIT_S:-170}" python3 -m pytest -q -m gpu tests/kernels -n 12 --durations=30 -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log"
echo "gpu tests: exit $? wall $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu_tests.log"
timeout "${SWEEP_LIMIT_S:-220}" python3 benchmarks/prefill/sweep_pages_rare.py --out "$OUT" 2>&1 | tee "$OUT/sweep.log"
echo "sweep: exit $? total wall $(( $(date +%s) - start )) s"
