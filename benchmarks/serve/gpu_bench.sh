#!/bin/bash
# The GPU run of bench_load.py on the device machine, in two calls (the 98 MB model file is
# larger than what one call carries; the halves are made with
# `split -b 50000000 -d SmolLM2-135M-Instruct.Q4_1.gguf` into .gpu_model_a/part and .gpu_model_b/part).
#   stage 1 (carry .whl .gpu_model_a): install the HTTP stack wheels, stash the first half
#   stage 2 (carry .gpu_model_b):      rebuild + verify the model, run the benchmark on cuda
set -euo pipefail
stage=$1
if [ "$stage" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  mkdir -p /tmp/msa_home/models/smollm2-135m
  cp .gpu_model_a/part /tmp/msa_home/part_a
  PYTHONPATH=/tmp/site:$PWD python3 -c "import fastapi, uvicorn, openai, gguf, torch; print('ok', torch.__version__, torch.cuda.get_device_name())"
else
  f=/tmp/msa_home/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
  cat /tmp/msa_home/part_a .gpu_model_b/part > $f
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $f" | sha256sum -c
  export MSA_EVAL_HOME=/tmp/msa_home PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 benchmarks/serve/bench_load.py --device cuda --rounds 8 --out "$OUT/results_gpu.json" "${@:2}" 2>&1 | tee "$OUT/bench_gpu.log"
fi
