#!/usr/bin/env bash
# One device call: GPU tests, then the benchmarks; logs and JSON under $OUT, tables printed at the end.
# Expects the default model's GGUF joined at /root/models/smollm2.gguf and the gguf wheel in .whl/.
#   bash benchmarks/engine_gpu/run_device.sh [tests,step,decode,msa,msagraphs]
# step: bench_step.py (where a decode step's time goes); with .prof_old/engine (an older engine, e.g.
#   `git archive HEAD engine | tar -x -C .prof_old`, carried) also the same for that engine, label before.
# Knobs (environment): TESTS (pytest targets), T_* (per-section timeouts, s), DECODE_ARGS, MSA_ARGS, GRAPHS_ARGS.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD MSA_EVAL_HOME=/root/msa-home
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/gguf-*.whl || exit 1
mkdir -p $MSA_EVAL_HOME/models/smollm2-135m
ln -sf /root/models/smollm2.gguf $MSA_EVAL_HOME/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
WHAT=${1:-tests,decode,msa}
TESTS=${TESTS:-tests/engine/test_gpu_engine.py tests/engine/test_gpu_ops.py}
if [[ $WHAT == *tests* ]]; then
  timeout ${T_TESTS:-150} python3 -m pytest -q $TESTS -p no:cacheprovider --durations=5 2>&1 | tee $OUT/tests.log | tail -25
fi
if [[ $WHAT == *step* ]]; then
  if [[ -d .prof_old/engine ]]; then
    PYTHONPATH=$PWD/.prof_old:$PYTHONPATH timeout ${T_STEP:-120} python3 benchmarks/engine_gpu/bench_step.py --out $OUT \
      --gguf /root/models/smollm2.gguf --label before --modes sync 2>&1 | tee $OUT/step_before.log | grep -v Warning
  fi
  timeout ${T_STEP:-120} python3 benchmarks/engine_gpu/bench_step.py --out $OUT --gguf /root/models/smollm2.gguf \
    ${STEP_ARGS:-} 2>&1 | tee $OUT/step_after.log | grep -v Warning
fi
if [[ $WHAT == *msagraphs* ]]; then
  timeout ${T_GRAPHS:-90} python3 benchmarks/engine_gpu/bench_msa_graphs.py --out $OUT ${GRAPHS_ARGS:-} \
    2>&1 | tee $OUT/msa_graphs.log | grep -v Warning | tail -20
fi
if [[ $WHAT == *decode* ]]; then
  timeout ${T_DECODE:-120} python3 benchmarks/engine_gpu/bench_decode.py --out $OUT --gguf /root/models/smollm2.gguf \
    ${DECODE_ARGS:-} 2>&1 | tee $OUT/decode.log | grep -v Warning | tail -20
fi
if [[ $WHAT == *msa,* || $WHAT == *msa ]]; then
  timeout ${T_MSA:-150} python3 benchmarks/engine_gpu/bench_msa.py --out $OUT ${MSA_ARGS:-} 2>&1 | tee $OUT/msa.log | tail -30
fi
for f in $OUT/*.json; do [[ -f $f ]] && python3 benchmarks/engine_gpu/tables.py $f; done
