#!/usr/bin/env bash
# One device call: every GPU-marked kernel test, then one sweep script (on the GPU machine, repo root;
# logs under $OUT).
#   bash benchmarks/prefill/run_h200.sh                                   (run 5, call 1: sweep_run5.py)
#   SWEEP=sweep_run5_api.py SWEEP_ARGS="--budget-s 120" bash benchmarks/prefill/run_h200.sh   (run 5, call 2)
#   SWEEP=sweep_pages_rare.py SWEEP_ARGS= bash benchmarks/prefill/run_h200.sh                 (run 3)
#   SWEEP=sweep_run6.py SWEEP_ARGS="--budget-s 200" bash benchmarks/prefill/run_h200.sh       (run 6, sweep 1)
set -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 OUT=${OUT:-.}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/env.txt"
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> "$OUT/env.txt"
start=$(date +%s)
timeout "${TEST_LIMIT_S:-150}" python3 -m pytest -q -m gpu tests/kernels -n 12 --durations=10 -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
echo "gpu tests: exit $? wall $(( $(date +%s) - start )) s" | tee -a "$OUT/gpu_tests.log"
timeout "${SWEEP_LIMIT_S:-330}" python3 "benchmarks/prefill/${SWEEP:-sweep_run5.py}" --out "$OUT" ${SWEEP_ARGS---budget-s 240} > "$OUT/sweep.log" 2>&1; rc=$?
grep -v '^{' "$OUT/sweep.log" | tail -80
echo "sweep: exit $rc total wall $(( $(date +%s) - start )) s"
