#!/usr/bin/env bash
# Times the README's main command (`make run` = `msa-eval run helmet --backend local`) on this
# machine and prints one Markdown row for RESULTS.md: wall time, CPU time, load average
# before/after (other processes on a shared machine inflate wall time), and the overall
# scores. Usage: benchmarks/helmet_default/run.sh [extra msa-eval run flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(mktemp -d /tmp/helmet-default-XXXX)
load0=$(cut -d' ' -f1 /proc/loadavg)
start=$(date +%s.%N)
/usr/bin/env time -f "%e %U %S %M" -o "$out/time.txt" \
  .venv/bin/msa-eval run helmet --backend local --out "$out/run" "$@" > "$out/stdout.txt"
end=$(date +%s.%N)
load1=$(cut -d' ' -f1 /proc/loadavg)
read -r wall user sys maxrss < "$out/time.txt"
overall=$(.venv/bin/python - "$out/run/report/report.json" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
row = [r for r in rep["rows"] if r["kind"] == "overall"][0]
print(", ".join(f"{k} {v}" for k, v in row["cells"].items()))
PY
)
echo "| $(date -u +%Y-%m-%d) | $(getconf _NPROCESSORS_ONLN) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) | ${wall}s | $(echo "$user + $sys" | bc)s | $load0 -> $load1 | $((maxrss / 1024)) MB | $overall | \`msa-eval run helmet --backend local $*\` |"
echo "run directory: $out/run" >&2
