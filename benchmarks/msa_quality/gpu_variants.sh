#!/usr/bin/env bash
# Round 2 of the MSA quality benchmark on one H200 (device `run` tool): calibrate indexer variants,
# evaluate each on the same needles, pick the best (summed accuracy over the cells), calibrate its
# B64/k8 twin, measure the 8K attention-mass recall, and run the GPU test with the best shipped.
# Expects the GGUF at $MSA_EVAL_HOME/models/smollm2-135m/, the gguf wheel and needles.jsonl in .msa_gpu/.
#   bash benchmarks/msa_quality/gpu_variants.sh            (writes $OUT/log.txt, $OUT/raw/, $OUT/ad_*.tar)
# Smoke test on the CPU: SMOKE=1 OUT=/tmp/x DEVICE=cpu bash benchmarks/msa_quality/gpu_variants.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT}"
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .msa_gpu/gguf-*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  PY=python3
else
  PY=${PY:-.venv/bin/python}
fi
NEEDLES=${NEEDLES:-.msa_gpu/needles.jsonl}
# the shipped recipe's scale (32K tokens, 120 + 60 steps, 256 queries); SMOKE=1: tiny, to test the flow
if [ "${SMOKE:-0}" = 1 ]; then SCALE="--tokens 2048 --seq-len 1024 --warmup-steps 2 --steps 1 --queries 16"
else SCALE="--tokens 32768 --warmup-steps 120 --steps 60 --queries 256"; fi
# name|flags (the levers: teacher, long-range query share, recurrence share, dense layers)
VARIANTS=${VARIANTS:-"max|--teacher max --long-range 0.5 --recurrence 0.1
max-d7|--teacher max --long-range 0.5 --recurrence 0.1 --dense-layers 0,1,7"}
AD=${AD:-.msa_gpu/adapters}
mkdir -p $AD $OUT/raw
log() { echo "[$(date +%T)] $*" | tee -a $OUT/log.txt; }
train() {  # name flags...
  local name=$1; shift
  log "sparsify $name: $*"
  $PY benchmarks/msa_quality/sparsify_standalone.py sparsify --model smollm2-135m --out $AD/$name $SCALE --seed 0 \
    --device $DEVICE --json "$@" > $AD/$name.json 2>> $OUT/log.txt || { log "sparsify $name FAILED"; return 1; }
  $PY -c "import json,sys; d=json.load(open('$AD/$name.json')); print('$name', 'recall', round(d['mean_recall_before'],3), '->', round(d['mean_recall_after'],3), 'wall', d['wall_seconds'])" | tee -a $OUT/log.txt
  tar -cf $OUT/ad_$name.tar -C $AD $name
}
SETTINGS=(dense ${OLD:+msa})  # OLD=1: also the previously shipped indexer (`msa`), same run
log "$($PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")')"
declare -A FLAGS
NAMES=()  # in VARIANTS order: the first listed wins a tie
while IFS='|' read -r name flags; do
  [ -n "$name" ] || continue
  FLAGS[$name]="$flags"
  NAMES+=("$name")
  train $name $flags && SETTINGS+=("$name=$AD/$name")
done <<< "$VARIANTS"
log "needles: ${SETTINGS[*]}"
$PY benchmarks/msa_quality/needle_eval.py --needles $NEEDLES --out $OUT/raw --recall 0 --max-seqs ${MAX_SEQS:-64} --settings "${SETTINGS[@]}" 2>&1 \
  | grep -v Warning | tee -a $OUT/log.txt
BEST=$($PY benchmarks/msa_quality/score.py $OUT/raw --best "${NAMES[@]}") || { log "no needle results"; exit 1; }
log "best: $BEST (${FLAGS[$BEST]:-})"
if [ -n "$BEST" ] && [ -n "${FLAGS[$BEST]:-}" ]; then
  train ${BEST}-b64k8 ${FLAGS[$BEST]} --block-size 64 --topk 8
  $PY benchmarks/msa_quality/needle_eval.py --needles $NEEDLES --out $OUT/raw --recall ${RECALL:-4} --max-seqs ${MAX_SEQS:-64} \
    --settings "${BEST}-b64k8=$AD/${BEST}-b64k8" --recall-model smollm2-135m+$AD/$BEST \
    --recall-model-b64 smollm2-135m+$AD/${BEST}-b64k8 2>&1 | grep -v Warning | tee -a $OUT/log.txt
  [ "$DEVICE" = cuda ] && cp $AD/$BEST/* engine/adapters/smollm2-135m/  # the GPU test below runs the shipped adapter
fi
$PY benchmarks/msa_quality/score.py $OUT/raw | tee -a $OUT/log.txt
[ "$DEVICE" = cuda ] && $PY -m pytest -q -p no:cacheprovider tests/engine/test_msa.py -k gpu 2>&1 | tail -5 | tee -a $OUT/log.txt
log done
