#!/usr/bin/env bash
# Every GPU measurement of docs/benchmarks.md and the CUDA tests, stage by stage, on one GPU:
#
#   bash benchmarks/cuda_session.sh OUT_DIR optim throughput train memory optim_memory moe flat tests
#
# Each stage writes its log (and its result JSON) into OUT_DIR; a stage that fails or runs out
# of its time limit does not stop the next. Run from the repository root with danastar importable
# (an installed danastar, or PYTHONPATH=src).
set -uo pipefail
out=${1:?usage: cuda_session.sh OUT_DIR STAGE...}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

stage_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$python" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
}

stage_optim() {
  # Fill the compile caches with one process per size, then time everything in one process.
  # Rows not measured again (OPTIM_ARGS="--only compiled") are kept from the committed result.
  local size
  for size in 1e6 1e7 1e8 1e9; do
    "$python" benchmarks/optim_step.py --device cuda --sizes $size --dtypes float32 bfloat16 \
      --compile-only ${OPTIM_ARGS:-} > "/tmp/optim_prewarm_$size.log" 2>&1 &
  done
  wait
  tail -n 3 /tmp/optim_prewarm_*.log
  cp benchmarks/results/optim_step-cuda.json "$out/" 2>/dev/null
  "$python" benchmarks/optim_step.py --device cuda --dtypes float32 bfloat16 ${OPTIM_ARGS:-} \
    --out "$out/optim_step-cuda.json"
}

stage_throughput() {
  "$python" benchmarks/model_throughput.py --device cuda --output "$out/model_throughput-cuda.json" \
    ${THROUGHPUT_ARGS:-}
}

stage_train() {
  # The whole training step of `danastar train` (data, optimizer, logging) on random GPT-2 tokens.
  local data=/tmp/danastar-random-gpt2
  "$python" - "$data" <<'EOF'
import sys, pathlib, numpy as np
directory = pathlib.Path(sys.argv[1]); directory.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
for name, count in (("train.bin", 40_000_000), ("val.bin", 1_000_000)):
    rng.integers(0, 50257, count, dtype=np.uint16).tofile(directory / name)
EOF
  local spec arch heads
  for spec in ${TRAIN_MODELS:-enoki:12 qwen3:4}; do
    arch=${spec%%:*}; heads=${spec##*:}
    "$python" -m danastar train --dataset "$data" --arch "$arch" --heads "$heads" \
      --batch_size ${TRAIN_BATCH:-16} --sequence_length ${TRAIN_SEQ:-1024} --iterations 80 \
      --log_interval 10 --eval_interval 100000 train.eval_batches=1 train.final_eval_batches=1 \
      train.compile=true train.sample_tokens=0 checkpoint.latest_every=-1 logging.progress=false \
      --run_dir "/tmp/danastar-runs/$arch-$heads"
    sed "s/^/{\"model\": \"$arch-$heads\", \"record\": /; s/\$/}/" \
      "/tmp/danastar-runs/$arch-$heads/metrics.jsonl" >> "$out/train-metrics.jsonl"
  done
}

stage_memory() {
  "$python" benchmarks/train_memory.py --device cuda --output "$out/train_memory-cuda.json"
}

stage_optim_memory() {
  # bytes per parameter and the peak of a step, compiled, float32 and bf16 state (a process a row)
  "$python" benchmarks/optim_memory.py --device cuda --only "adamw fused (torch)" adana \
    dana-star-mk4 --out "$out/optim_memory-cuda.json"
}

stage_flat() {
  # per-tensor, flat and CUDA-graph steps against fused AdamW; each list compiles its own steps.
  # FLAT_LISTS: flat_step.py's list names separated by ';' (they contain spaces and commas)
  local lists
  IFS=';' read -ra lists <<< "${FLAT_LISTS:-enoki h4}"
  "$python" benchmarks/flat_step.py --device cuda --rounds 41 --lists "${lists[@]}" \
    --out "$out/flat_step-cuda.json"
}

stage_moe() {
  "$python" benchmarks/moe_experts.py --device cuda --out "$out/moe_experts-cuda.json"
}

stage_tests() {
  # every `cuda` test of the tree, in one process: with four pytest-xdist workers sharing the
  # GPU, the bitwise resume test once saw its two runs differ (docs/benchmarks.md)
  "$python" -m pytest -q -m cuda -p no:cacheprovider -o addopts=-ra tests
}

for stage in "$@"; do
  echo "=== $stage ($(date -u +%T))"
  limit_var="LIMIT_${stage^^}"
  timeout "${!limit_var:-600}" bash -c "$(declare -f stage_$stage); $(declare -p out python); stage_$stage" \
    > "$out/$stage.log" 2>&1
  echo "exit $? after stage $stage ($(date -u +%T))"
  tail -n "${TAIL:-25}" "$out/$stage.log"
done
