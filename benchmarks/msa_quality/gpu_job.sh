#!/usr/bin/env bash
# The GPU half of the MSA quality benchmark (one H200, through the device `run` tool). Expects the
# GGUF at $MSA_EVAL_HOME/models/smollm2-135m/, the gguf wheel and needles.jsonl in .msa_gpu/.
# 1. calibrate the shipped indexer (`msa-eval sparsify`, exact command below), 2. needle eval
# (dense, msa B128/k16, msa B64/k8), 3. 8K attention-mass recall, 4. the GPU test (msa == msa-ref).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .msa_gpu/gguf-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
AD=engine/adapters/smollm2-135m
python3 benchmarks/msa_quality/sparsify_standalone.py sparsify --model smollm2-135m --out $AD --tokens 32768 --warmup-steps 120 \
  --steps 60 --queries 256 --seed 0 --device cuda --json > $OUT/sparsify.json || exit 1
cp $AD/indexer.safetensors $AD/msa_config.json $AD/provenance.json $OUT/
python3 benchmarks/msa_quality/needle_eval.py --needles .msa_gpu/needles.jsonl --out $OUT --recall 4
python3 -m pytest -q -p no:cacheprovider tests/engine/test_msa.py -k gpu 2>&1 | tail -5
