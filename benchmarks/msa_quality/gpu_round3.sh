#!/usr/bin/env bash
# Round 3 of the MSA quality benchmark, one device call: pick the indexer variant on DEV needles,
# then report it on the TEST needles (dense in the same run), with its B64/k8 twin, the 8K recall
# and the GPU test with the winner in place. No training: the variants are the round-2 adapter
# (`max-d7`, shipped) with more layers kept dense (`engine.sparsify.subset.keep_dense`, byte for
# byte what `sparsify --dense-layers ...` trains: per-layer independence, tests/engine/test_sparsify.py).
#   OUT=... R3=/root/r3 bash benchmarks/msa_quality/gpu_round3.sh
# R3 holds needles_dev.jsonl[.gz], needles_test.jsonl[.gz], max-d7-b64k8/ (round-2 B64/k8 twin) and
# the gguf wheel. Smoke test on the CPU: DEVICE=cpu OUT=/tmp/x R3=/tmp/r3s bash benchmarks/msa_quality/gpu_round3.sh
# Knobs: VARIANTS (name:extra dense layers, the first listed wins ties: the shipped one),
# RECALL (8K prompts for the recall, 0 = skip), MAX_SEQS, EXTRA=1 (also the shipped indexer on TEST).
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT}" "${R3:?set R3}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $R3/gguf-*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD MSA_EVAL_HOME=/root/msa-home
  mkdir -p $MSA_EVAL_HOME/models/smollm2-135m
  ln -sf /root/models/smollm2.gguf $MSA_EVAL_HOME/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
  PY=python3
else
  PY=${PY:-.venv/bin/python}
fi
for f in $R3/needles_*.jsonl.gz; do [ -f "$f" ] && gunzip -kf "$f"; done
DEV=$R3/needles_dev.jsonl TEST=$R3/needles_test.jsonl AD=${AD:-/tmp/r3_adapters}
VARIANTS=${VARIANTS:-"max-d7: max-d7-20:20 max-d7-20-23:20,23"}
mkdir -p $OUT/dev $OUT/test $AD
log() { echo "[$(date +%T)] $*" | tee -a $OUT/log.txt; }
log "$($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")')"
log "needles: $(sha256sum $DEV $TEST | awk '{print substr($1,1,12)}' | tr '\n' ' ')"
# the variants and their B64/k8 twins, from the shipped adapter and the round-2 twin
$PY - "$AD" "$R3/max-d7-b64k8" "$VARIANTS" <<'EOF' 2>&1 | tee -a $OUT/log.txt || exit 1
import hashlib, shutil, sys
from pathlib import Path
from engine.sparsify.subset import keep_dense
ad, twin, variants = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split()
for v in variants:
    name, extra = v.split(":")
    for src, out in (("engine/adapters/smollm2-135m", ad / name), (twin, ad / f"{name}-b64k8")):
        if extra:
            keep_dense(src, [int(x) for x in extra.split(",")], out)
        else:
            shutil.copytree(src, out, dirs_exist_ok=True)
        print(out.name, hashlib.sha256((out / "indexer.safetensors").read_bytes()).hexdigest()[:12])
EOF
NAMES=() SETTINGS=(dense)
for v in $VARIANTS; do NAMES+=("${v%%:*}"); SETTINGS+=("${v%%:*}=$AD/${v%%:*}"); done
log "DEV: ${SETTINGS[*]}"
$PY benchmarks/msa_quality/needle_eval.py --needles $DEV --out $OUT/dev --recall 0 --max-seqs ${MAX_SEQS:-64} \
  --settings "${SETTINGS[@]}" 2>&1 | grep -v Warning | tee -a $OUT/log.txt
BEST=$($PY benchmarks/msa_quality/score.py $OUT/dev --best "${NAMES[@]}") || { log "no dev results"; exit 1; }
log "best on dev: $BEST"
TSET=(dense "$BEST=$AD/$BEST" "$BEST-b64k8=$AD/$BEST-b64k8")
[ "${EXTRA:-0}" = 1 ] && [ "$BEST" != "${NAMES[0]}" ] && TSET+=("${NAMES[0]}=$AD/${NAMES[0]}")
log "TEST: ${TSET[*]}"
$PY benchmarks/msa_quality/needle_eval.py --needles $TEST --out $OUT/test --recall ${RECALL:-4} --max-seqs ${MAX_SEQS:-64} \
  --settings "${TSET[@]}" --recall-model smollm2-135m+$AD/$BEST --recall-model-b64 smollm2-135m+$AD/$BEST-b64k8 \
  2>&1 | grep -v Warning | tee -a $OUT/log.txt
for s in dev test; do $PY benchmarks/msa_quality/score.py $OUT/$s --out $OUT/$s.md > /dev/null; done
if [ "$DEVICE" = cuda ]; then
  cp $AD/$BEST/* engine/adapters/smollm2-135m/  # the GPU test runs the adapter that would ship
  timeout ${T_TEST:-150} $PY -m pytest -q -p no:cacheprovider tests/engine/test_msa.py -k gpu 2>&1 | tail -4 | tee -a $OUT/log.txt
fi
for s in dev test; do echo "== $s"; cat $OUT/$s.md; done
log done
