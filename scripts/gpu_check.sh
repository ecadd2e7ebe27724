#!/usr/bin/env bash
# GPU check: `dplora train` + `verify` on CUDA in fp32 and bf16, the fast path against brute force, then the benchmark.
# Runs on a GPU machine with no internet in a few minutes. Needs .gpu/ from scripts/gpu_prepare.sh (wheels of the
# packages that machine lacks, SmolLM2-135M's config and tokenizer): real weights cannot travel, so the model is
# a random-init SmolLM2-135M architecture built from its config. Prints s/step and peak memory per dtype.
# Usage: bash scripts/gpu_check.sh [OUT_DIR]   (logs and the bench JSON/markdown go to OUT_DIR)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/dplora-gpu}}
mkdir -p "$OUT"
W=/tmp/dplora-gpu-work
SITE=/tmp/dplora-site
rm -rf "$W" && mkdir -p "$W"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DPLORA_CACHE_DIR="$W/cache" DPLORA_LEDGER="$W/ledger.sqlite3"
PY=${PYTHON:-python3}
t0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -m pip install -q --no-index --no-deps --target "$SITE" .gpu/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH="$SITE:$PWD"
$PY -c "import torch, transformers, peft, opacus; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
  'transformers', transformers.__version__, 'peft', peft.__version__, 'opacus', opacus.__version__)"
$PY - "$W/smollm2-random" <<'PY'
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
out = Path(sys.argv[1]); src = Path(".gpu/smollm2")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
model.save_pretrained(out)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, out / f.name)
print(f"random-init SmolLM2-135M architecture: {sum(p.numel() for p in model.parameters()):,} parameters")
PY
D="$PY -m dplora"
$D demo-data "$W/tickets.csv" --tickets 1000 --overwrite >/dev/null
$D keygen "$W/signing.key" >/dev/null
rc_all=0
for dtype in fp32 bf16; do
  echo "=== train + verify, model.dtype=$dtype (r=8 on q,v; 32 units/step, physical 16, seq 128, ${STEPS:-30} steps)"
  $D train configs/demo.yaml --signing-key "$W/signing.key" --no-progress model.name=null \
    "model.path=$W/smollm2-random" "model.dtype=$dtype" "data.path=$W/tickets.csv" \
    "training.output_dir=$W/run-$dtype" training.physical_batch_size=16 training.max_seq_len=128 \
    "training.steps=${STEPS:-30}" 2>&1 | tee "$OUT/train-$dtype.log"
  rc=${PIPESTATUS[0]}; echo "train exit code ($dtype): $rc"; [ "$rc" = 0 ] || rc_all=1
  $D verify "$W/run-$dtype" --public-key "$W/signing.pub" 2>&1 | tee "$OUT/verify-$dtype.log"
  rc=${PIPESTATUS[0]}; echo "verify exit code ($dtype): $rc"; [ "$rc" = 0 ] || rc_all=1
  tail -n 3 "$W/run-$dtype/metrics.jsonl" | cut -c1-160
done
if [ -f scripts/check_fastclip.py ]; then
  echo "=== scripts/check_fastclip.py (fast path vs one-record-at-a-time brute force on CUDA, fp32 and bf16 base)"
  timeout "${CHECK_TIMEOUT:-150}" $PY scripts/check_fastclip.py 2>&1 | tee "$OUT/check_fastclip.log"
  rc=${PIPESTATUS[0]}; echo "check_fastclip exit code: $rc"; [ "$rc" = 0 ] || rc_all=1
fi
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$NGPU" -ge 2 ]; then  # 1 against 2 processes (nccl, one GPU each) on the bf16 run above: compare s/step
  echo "=== torchrun 2 processes, model.dtype=bf16 (same contract; compare 'done: ... s/step' with the run above)"
  $PY -m torch.distributed.run --standalone --nproc-per-node 2 -m dplora train configs/demo.yaml \
    --signing-key "$W/signing.key" --no-progress model.name=null "model.path=$W/smollm2-random" model.dtype=bf16 \
    "data.path=$W/tickets.csv" "training.output_dir=$W/run-bf16-2proc" training.physical_batch_size=16 \
    training.max_seq_len=128 "training.steps=${STEPS:-30}" 2>&1 | grep -v "^W" | tee "$OUT/train-bf16-2proc.log"
  rc=${PIPESTATUS[0]}; echo "train exit code (2 processes): $rc"; [ "$rc" = 0 ] || rc_all=1
  $D verify "$W/run-bf16-2proc" --public-key "$W/signing.pub" || rc_all=1
else
  echo "=== $NGPU GPU: no 2-process run (nccl needs one GPU per process)"
fi
if [ -f scripts/bench.py ]; then
  echo "=== scripts/bench.py"
  timeout "${BENCH_TIMEOUT:-300}" $PY scripts/bench.py --out "$OUT/bench" 2>&1 | tail -n 60
  echo "bench exit code: ${PIPESTATUS[0]}"
fi
echo "gpu_check: $(( $(date +%s) - t0 )) s, overall exit $rc_all"
exit $rc_all
