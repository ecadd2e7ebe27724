#!/usr/bin/env bash
# GPU check (issue 30): every stage with its own timeout, fastest first, sized so the commands fit ~9 minutes on one
# H200 (a 15-minute device budget including the machine's start). Needs .gpu/ from scripts/gpu_prepare.sh (wheels
# of the packages that machine lacks, bitsandbytes among them, and SmolLM2-135M's config and tokenizer): real
# weights cannot travel, so every model is random-init from a config.
#
#   stage          what                                                                      H200 estimate  timeout
#   setup          wheels into $SITE; SmolLM2-135M: the received GGUF parts joined, sha256-checked and converted
#                  (real weights), else random-init from the config                         ~25–70 s       120 s
#   train-bf16     dplora train + verify, 135M shape, bf16, r=8 q,v, 32 units/step, 16×128, 30 steps  ~60 s  180 s
#   fsdp           dplora train + verify with training.sharding: fsdp at world size 1 (NCCL), 135M, bf16, ckpt  ~30 s  90 s
#   fastclip       scripts/check_fastclip.py: fast path vs one-record reference on CUDA, fp32+bf16    ~40 s  150 s
#   scale-1b       scripts/bench_scale.py, Llama-3.2-1B shape, bf16, seq 512 and 2048, plain/ckpt/4bit,
#                  non_dp vs dplora_fast, largest batch up to 64                                ~120 s         200 s
#   scale-8b       the same on a Llama-3.1-8B shape, largest batch up to 16                     ~210 s         260 s
#   noise          scripts/bench_noise.py --device cuda: noise s per logical step at 0.5M/5M/40M LoRA weights ~30 s  90 s
#   utility        (only with --utility) scripts/utility_bench.py --full on Bitext (.gpu/data), the setup's 135M,
#                  1 repeat, rows base / control / DP-planner ε=8 / DP-hand ε=8, 1,600 training rows (3 epochs:
#                  the planner weighs B 32..96), 400 held-out rows, 320 tokens: 3 trainings of 4,800 rows (estimate,
#                  not measured yet)                                                          ~150 s         240 s
#   total without utility: ~485 s of commands (~8.1 min), timeouts sum to 1000 s; with it ~635 s (~10.6 min); a
#   stage that overruns is cut and reported, the next one still runs. The check ends with ONE markdown table
#   (scripts/gpu_table.py: stage, DP/non-DP time and memory ratios, tokens/s, largest batch, noise s/step, utility
#   rows), also written to OUT_DIR/gpu_check.md for docs/gpu.md and a note.
#
# --dry-run: the same stages on CPU at toy sizes (a tiny Llama, 2 steps, toy bench shapes with each variant once:
# scale-1b plain and 4-bit, scale-8b checkpointing; utility: --toy --full on Bitext, ε = 8, 1 repeat, T ≤ 10, SKIP
# when no Bitext folder is in DPLORA_UTILITY_DATA or ../shared/data, as in a fresh clone),
# no .gpu/ needed; tests/scripts/test_gpu_check.py runs it. Every stage prints "STAGE <name>: OK|FAIL|SKIP".
# Usage: bash scripts/gpu_check.sh [--dry-run] [--utility] [OUT_DIR]   (logs, bench JSON/markdown go to OUT_DIR)
#
# Real weights (issue 47): a device call carries 64 MiB, so scripts/gpu_prepare.sh splits the packaged GGUF into
# .gpu/weights-1 … weights-N; `bash scripts/gpu_check.sh --part K` (one call per part, each carrying only
# .gpu/weights-K) checks part K's sha256 and keeps it in .gpu/received (ignored, kept on the warm machine). The
# setup stage then joins the received parts, checks the whole file's sha256 and converts it to safetensors: the
# 135M stages train the real SmolLM2-135M-Instruct (a missing part or a wrong sha256 fails setup). Without parts
# the model is random-init as before. In --dry-run the parts are joined and checked, not converted (the tiny model
# trains). Exact call sequence: docs/gpu.md. GPU_DIR (default .gpu) moves .gpu/.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0 UTILITY=0 OUT="" PART=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --utility) UTILITY=1 ;;
    --part) PART=${2:-}; shift ;;
    --part=*) PART=${1#--part=} ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) OUT=$1 ;;
  esac
  shift
done
GPU_DIR=${GPU_DIR:-.gpu}
RECEIVED="$GPU_DIR/received"
if [ -n "$PART" ]; then  # receive weights part K (its own device call) and stop
  case "$PART" in ''|*[!0-9]*) echo "--part takes a part number K ≥ 1, got '$PART'" >&2; exit 2 ;; esac
  src="$GPU_DIR/weights-$PART"
  if [ ! -f "$src/part-$PART.sha256" ]; then
    echo "--part $PART: $src/part-$PART.sha256 is missing: run scripts/gpu_prepare.sh here and carry .gpu/weights-$PART" >&2
    exit 2
  fi
  (cd "$src" && sha256sum -c --quiet "part-$PART.sha256") || { echo "PART $PART: FAIL (sha256 of the part)"; exit 1; }
  mkdir -p "$RECEIVED"
  cp "$src"/* "$RECEIVED/"
  echo "PART $PART of $(cat "$src/weights.parts"): OK ($(stat -c %s "$src"/*.part-"$PART") bytes, sha256 checked) in $RECEIVED"
  exit 0
fi
OUT=${OUT:-${OUT_DIR:-/tmp/dplora-gpu}}
mkdir -p "$OUT"
W=$(mktemp -d "${TMPDIR:-/tmp}/dplora-gpu-work.XXXXXX")
SITE=${SITE:-/tmp/dplora-site}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DPLORA_CACHE_DIR="$W/cache" DPLORA_LEDGER="$W/ledger.sqlite3"
PY=${PYTHON:-python3}
D="$PY -m dplora"
t0=$(date +%s)
rc_all=0
declare -a SUMMARY=()

# stage NAME TIMEOUT_S COMMAND...: runs COMMAND (a shell function or program) under its own timeout, logs to OUT.
stage() {
  local name=$1 limit=$2; shift 2
  local s0; s0=$(date +%s)
  echo "=== $name (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - s0 ))
  if [ "$rc" = 0 ]; then
    SUMMARY+=("STAGE $name: OK (${took}s)")
  else
    [ "$rc" = 124 ] && rc="$rc, timed out"
    SUMMARY+=("STAGE $name: FAIL (exit $rc, ${took}s)"); rc_all=1
  fi
  echo "${SUMMARY[-1]}"
}

if [ "$DRY" = 1 ]; then
  DEVICE=cpu STEPS=2 TICKETS=1000 SEQS="16" MAXB1=2 MAXB8=0 TIMEB=2
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  DEVICE=cuda STEPS=${STEPS:-30} TICKETS=1000 SEQS="512 2048" MAXB1=64 MAXB8=16 TIMEB=""
  export PYTHONPATH="$SITE:$PWD"
fi
export W SITE PY D DRY DEVICE STEPS TICKETS SEQS TIMEB OUT GPU_DIR RECEIVED

# join_weights: the received GGUF parts joined into $W/gguf/NAME and checked against the whole file's sha256;
# prints nothing and succeeds when no part was received; fails on a missing part or a wrong sha256.
join_weights() {
  [ -f "$RECEIVED/weights.sha256" ] || return 0
  local n name k
  n=$(cat "$RECEIVED/weights.parts") name=$(awk '{print $2}' "$RECEIVED/weights.sha256")
  for k in $(seq 1 "$n"); do
    [ -f "$RECEIVED/$name.part-$k" ] || { echo "weights: part $k of $n was not received (gpu_check.sh --part $k)"; return 1; }
  done
  mkdir -p "$W/gguf"
  for k in $(seq 1 "$n"); do cat "$RECEIVED/$name.part-$k"; done >"$W/gguf/$name"
  cp "$RECEIVED/weights.sha256" "$W/gguf/"
  (cd "$W/gguf" && sha256sum -c --quiet weights.sha256) || { echo "weights: sha256 of the joined $name: FAIL"; return 1; }
  echo "weights: $name joined from $n parts, $(stat -c %s "$W/gguf/$name") bytes, sha256 OK"
}

setup() {
  join_weights || return 1
  if [ "$DRY" = 1 ]; then  # the tiny Llama of the tests and its byte tokenizer
    $PY - "$W/model" <<'PY' || return 1
import sys
sys.path.insert(0, "tests")
from tiny import save_tiny_model
save_tiny_model(sys.argv[1])
print("tiny random Llama (hidden 16, 2 layers) for the dry run")
from pathlib import Path
from dplora.data.demo import write_tickets
from dplora.release.keys import generate_keypair
work = Path(sys.argv[1]).parent
write_tickets(work / "tickets.csv", num_tickets=1000, seed=0)
generate_keypair(work / "signing.key")
PY
    [ -d "$W/gguf" ] && echo "dry run: the joined weights are checked, not converted (the tiny model trains)"
    return 0
  else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    $PY -m pip install -q --no-index --no-deps --target "$SITE" "$GPU_DIR"/wheels/*.whl 2>&1 | tail -2
    $PY - "$W/model" "$GPU_DIR/smollm2" "$W/gguf" <<'PY' || return 1
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
out, src, gguf = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
files = sorted(gguf.glob("*.gguf")) if gguf.is_dir() else []
if files:  # the real SmolLM2-135M-Instruct, de-quantized from the sha256-checked GGUF (needs the gguf wheel)
    model = AutoModelForCausalLM.from_pretrained(str(gguf), gguf_file=files[0].name)
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    what = f"real weights from {files[0].name}"
else:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src))
    what = "random-init SmolLM2-135M architecture (no weights parts received)"
model.save_pretrained(out)
for f in src.iterdir():
    if f.name != "config.json" and f.is_file() and f.suffix != ".safetensors":
        shutil.copy(f, out / f.name)
print(f"{what}: {sum(p.numel() for p in model.parameters()):,} parameters")
PY
  fi
  $PY -c "import torch, transformers, peft, opacus; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
    'transformers', transformers.__version__, 'peft', peft.__version__, 'opacus', opacus.__version__)" &&
  $D demo-data "$W/tickets.csv" --tickets "$TICKETS" --overwrite >/dev/null &&
  $D keygen "$W/signing.key" >/dev/null
}

train_verify() {
  local extra=()
  # dry run: ε 2 gives σ ≈ 1 at T 2, whose attack-ceiling PLD (record and verify) takes under a second, not ~5 s
  [ "$DRY" = 1 ] && extra=(privacy.accountant=rdp privacy.target_epsilon=2 training.expected_batch_size=4
                           training.physical_batch_size=2 training.max_seq_len=32 training.threads=1)
  [ "$DRY" = 1 ] || extra=(training.physical_batch_size=16 training.max_seq_len=128)
  $D train configs/demo.yaml --signing-key "$W/signing.key" --no-progress model.name=null \
    "model.path=$W/model" model.dtype=bf16 "data.path=$W/tickets.csv" "training.output_dir=$W/run-bf16" \
    "training.steps=$STEPS" "${extra[@]}" || return $?
  $D verify "$W/run-bf16" --public-key "$W/signing.pub" || return $?
  tail -n 2 "$W/run-bf16.private/metrics.jsonl" 2>/dev/null | cut -c1-160 || true
}

fsdp_smoke() {  # training.sharding: fsdp at world size 1 (issue 45): NCCL on CUDA, gloo in the dry run
  local extra=(privacy.accountant=rdp privacy.target_epsilon=2 training.expected_batch_size=4
               training.physical_batch_size=2 training.max_seq_len=32 training.threads=1)
  [ "$DRY" = 1 ] || extra=(training.physical_batch_size=16 training.max_seq_len=128 training.gradient_checkpointing=true)
  $D train configs/demo.yaml --signing-key "$W/signing.key" --no-progress model.name=null \
    "model.path=$W/model" model.dtype=bf16 "data.path=$W/tickets.csv" "training.output_dir=$W/run-fsdp" \
    "training.steps=$STEPS" training.sharding=fsdp "${extra[@]}" || return $?
  $D verify "$W/run-fsdp" --public-key "$W/signing.pub" | grep -E "^(OK  signature|execution:)"
}

fastclip() {
  if [ "$DRY" = 1 ]; then
    $PY scripts/check_fastclip.py --device cpu --layers 1 --dtypes fp32 --toy
  else
    $PY scripts/check_fastclip.py --device cuda
  fi
}

scale() {  # scale ARCH MAX_BATCH [DRY-RUN VARIANTS...]
  local arch=$1 name=$1 maxb=$2 extra=(); shift 2
  # dry run: the toy shape, one step; each variant runs once across the two stages (1b: plain 4bit, 8b: ckpt)
  if [ "$DRY" = 1 ]; then arch=toy; extra=(--steps 1 --warmup 0 --variants "$@"); fi
  # shellcheck disable=SC2086
  $PY scripts/bench_scale.py --arch "$arch" --device "$DEVICE" --seqs $SEQS --max-batch "$maxb" \
    ${TIMEB:+--batch $TIMEB} --out "$OUT/scale-$name" "${extra[@]}"
}

utility() {  # the --full design (issue 33), sized to the device budget; real weights cannot travel: random init
  if [ "$DRY" = 1 ]; then
    $PY scripts/utility_bench.py --toy --full --only bitext --epsilons 8 --repeats 1 --threads 1 --max-steps 10 \
      --out "$OUT/utility" >/dev/null && tail -n 12 "$OUT/utility/utility.md"
  else
    [ -d "$GPU_DIR/data" ] && export DPLORA_UTILITY_DATA=$(cd "$GPU_DIR/data" && pwd)
    $PY scripts/utility_bench.py --full --only bitext --epsilons 8 --repeats 1 --max-train-rows 1600 \
      --model-path "$W/model" --out "$OUT/utility"
  fi
}

noise() {
  if [ "$DRY" = 1 ]; then
    $PY scripts/bench_noise.py --device cpu --sizes 20000 --compare-values 4096 --json "$OUT/noise.json"
  else
    $PY scripts/bench_noise.py --device cuda --json "$OUT/noise.json"
  fi
}

export -f join_weights setup train_verify fsdp_smoke fastclip scale utility noise
if [ "$DRY" = 1 ]; then T=(300 300 300 300 300 300 120 300); else T=(120 180 150 200 260 240 90 90); fi
stage setup "${T[0]}" setup
stage train-bf16 "${T[1]}" train_verify
stage fsdp "${T[7]}" fsdp_smoke
stage fastclip "${T[2]}" fastclip
stage scale-1b "${T[3]}" scale llama-1b "$MAXB1" plain 4bit
stage scale-8b "${T[4]}" scale llama-8b "$MAXB8" ckpt
stage noise "${T[6]}" noise
# the dry run's utility stage reads Bitext where utility_bench.py does; a fresh clone has no ../shared beside it
BITEXT_DIR="${DPLORA_UTILITY_DATA:-../shared/data}/bitext_customer_support"
if [ "$DRY" = 1 ] && [ ! -d "$BITEXT_DIR" ]; then
  SUMMARY+=("STAGE utility: SKIP (no Bitext data at $BITEXT_DIR)")
elif [ "$UTILITY" = 1 ] || [ "$DRY" = 1 ]; then
  stage utility "${T[5]}" utility
else
  SUMMARY+=("STAGE utility: SKIP (pass --utility)")
fi
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/stages.txt"
echo "=== table (also in $OUT/gpu_check.md)"
$PY scripts/gpu_table.py "$OUT" || echo "gpu_table: FAIL (the per-stage files are in $OUT)"
echo "gpu_check: $(( $(date +%s) - t0 )) s, overall exit $rc_all"
rm -rf "$W"
exit $rc_all
