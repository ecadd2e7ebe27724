#!/usr/bin/env bash
# GPU check, sized to the device's limits: a device call runs at most 600 s, only the last 12,000 characters of its
# output and at most 8 files under $OUT come back, and a session has 15 minutes of device time in all (the machine's
# start included). So the check is ONE call of at most ~540 s of estimated GPU time on one H100, and a second,
# optional call (--second) holds the 8B rows and the utility rows. Needs .gpu/ from scripts/gpu_prepare.sh (pinned
# wheels, SmolLM2-135M's config and tokenizer); real weights cannot travel in the one call, so every model is
# random-init from a config. Exact calls, carries and what to do with the minutes left: docs/gpu.md.
#
#   call 1 (default)
#   stage        what                                                                       estimate  timeout
#   setup        pinned wheels into $SITE (transformers and kernels as users get them), the
#                SmolLM2-135M architecture random-init from its config, tickets, a signing key    45 s     70 s
#   train-bf16   dplora train + verify, 135M, bf16, physical_batch_size: auto (the probe),
#                r=8 q,v, 32 units/step, 128 tokens, 30 steps                                   75 s    110 s
#   train-fp32   the same in fp32 with model.allow_tf32: true (the per-example check turns
#                TF32 off for itself), physical batch 16, 10 steps                               40 s     60 s
#   fsdp         dplora train + verify, training.sharding: fsdp at world size 1 (NCCL), 135M,
#                bf16, gradient checkpointing                                                    40 s     60 s
#   fastclip     scripts/check_fastclip.py: fast path vs one-record reference on CUDA, fp32+bf16 45 s     75 s
#   noise        scripts/bench_noise.py: noise s per logical step at 0.5M/5M/40M LoRA weights   30 s     50 s
#   scale-1b     scripts/bench_scale.py, Llama-3.2-1B shape, bf16, 512 tokens, plain and 4-bit,
#                non_dp vs dplora_fast, largest batch up to 64 (one bf16 build per row)        100 s    150 s
#   total                                                                                      375 s    575 s
#
#   call 2 (--second, optional)
#   setup        as above (the wheels are kept on a warm machine: skipped when unchanged)        30 s     70 s
#   scale-8b     bench_scale.py on a Llama-3.1-8B shape, 512 tokens, plain/ckpt/4-bit, largest
#                batch up to 16: built in bf16 once per variant and mode, peak reset after it   210 s    260 s
#   utility      scripts/utility_bench.py --full on Bitext (.gpu/data), the setup's 135M, 1 repeat,
#                base / control / DP-planner ε=8 / DP-hand ε=8, 1,600 rows, 320 tokens         150 s    200 s
#   total                                                                                      390 s    530 s
#
# The estimates are for one H100 (not yet measured there; the H200 ran the first weeks' train). A stage's timeout
# is also cut to what is left of BUDGET_S (default 570 s), so the call ends, with its files, before the device's
# 600 s. `--plan` prints the call's stages, estimates and timeouts and runs nothing (tests/slow/scripts/test_gpu_check.py
# checks the sums).
#
# Files: everything a stage writes (logs, bench JSON/markdown, the noise and utility reports) goes to a work folder;
# an exit trap (it also runs on a timeout or an error) copies exactly three files to OUT_DIR: gpu_check.md (the one
# table, scripts/gpu_table.py), stages.txt (the stage list: "STAGE name: OK|FAIL|SKIP (...)") and logs.tar.gz (the
# work folder). Exit status: 0 when every stage that ran is OK, else 10 + the position (0-based) of the first stage
# that failed in the call's list (setup 10, train-bf16 11, ...; call 2: setup 10, scale-8b 11, utility 12), so the
# status alone names it. Every stage's status is its own command's: no pipe hides it (pipefail and PIPESTATUS, or
# a log that is read after the command's status is kept). A failed setup skips the rest.
#
# --dry-run: the same stages on CPU at toy sizes (the tests' tiny Llama, 2 steps, toy bench shapes: scale-1b plain
# and 4-bit, scale-8b checkpointing; utility: --toy --full on Bitext, ε = 8, SKIP when no Bitext folder is in
# DPLORA_UTILITY_DATA or ../shared/data, as in a fresh clone); no .gpu/ needed. tests/slow/scripts/test_gpu_check.py
# runs it. Environment: GPU_CHECK_ONLY="stage ..." runs only those stages after setup (the others SKIP), e.g. to
# rerun a failed stage with the minutes left; GPU_CHECK_FAIL=stage makes that stage fail on purpose (the tests);
# BUDGET_S, GPU_DIR (default .gpu), SITE, PYTHON, STEPS, RECEIVED_WHEELS; UTILITY_STUDY="b256-e10 ..." makes the
# utility stage run those frontier levers of utility_bench.py --study on Bitext instead of the --full design (with
# the real weights received: docs/utility.md lists the rows and the call).
# Usage: bash scripts/gpu_check.sh [--dry-run] [--second] [--plan] [OUT_DIR]
#
# Real weights (optional, not in the one-call plan: each part is a call of its own): a device call carries 64 MiB,
# so scripts/gpu_prepare.sh splits the packaged GGUF into .gpu/weights-1 … weights-N; `gpu_check.sh --part K` (one
# call per part, carrying only .gpu/weights-K) checks part K's sha256 and keeps it in .gpu/received (kept on the
# warm machine). setup then joins the received parts, checks the whole file's sha256 and converts it to
# safetensors, and the 135M stages train the real SmolLM2-135M-Instruct (a missing part or a wrong sha256 fails
# setup). `gpu_check.sh --receive-wheels` (its own short call before the check, carrying .gpu/wheels-bnb) keeps the
# 43 MB bitsandbytes wheel, which does not fit one carry with the others, in RECEIVED_WHEELS (default
# /tmp/dplora-received-wheels: outside the checkout, which each call replaces, and kept while the machine is warm).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0 SECOND=0 PLAN_ONLY=0 OUT="" PART="" RECEIVE_WHEELS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --second) SECOND=1 ;;
    --plan) PLAN_ONLY=1 ;;
    --part) PART=${2:-}; shift ;;
    --part=*) PART=${1#--part=} ;;
    --receive-wheels) RECEIVE_WHEELS=1 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) OUT=$1 ;;
  esac
  shift
done
GPU_DIR=${GPU_DIR:-.gpu}
RECEIVED="$GPU_DIR/received"
RECEIVED_WHEELS=${RECEIVED_WHEELS:-/tmp/dplora-received-wheels}
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
if [ "$RECEIVE_WHEELS" = 1 ]; then  # keep the wheels that do not fit the check's own carry (their own call)
  src="$GPU_DIR/wheels-bnb"
  [ -f "$src/SHA256SUMS" ] || { echo "--receive-wheels: $src/SHA256SUMS is missing: run scripts/gpu_prepare.sh and carry .gpu/wheels-bnb" >&2; exit 2; }
  (cd "$src" && sha256sum -c --quiet SHA256SUMS) || { echo "WHEELS: FAIL (sha256)"; exit 1; }
  mkdir -p "$RECEIVED_WHEELS"
  cp "$src"/*.whl "$RECEIVED_WHEELS/"
  echo "WHEELS: OK ($(cd "$src" && ls ./*.whl | tr '\n' ' ')sha256 checked) in $RECEIVED_WHEELS"
  exit 0
fi

# The calls' stages, each with its estimate on one H100 and its timeout (seconds); the header's table states them.
if [ "$SECOND" = 1 ]; then PLAN=(setup scale-8b utility); else
  PLAN=(setup train-bf16 train-fp32 fsdp fastclip noise scale-1b); fi
declare -A EST=([setup]=45 [train-bf16]=75 [train-fp32]=40 [fsdp]=40 [fastclip]=45 [noise]=30 [scale-1b]=100
                [scale-8b]=210 [utility]=150)
declare -A LIMIT=([setup]=70 [train-bf16]=110 [train-fp32]=60 [fsdp]=60 [fastclip]=75 [noise]=50 [scale-1b]=150
                  [scale-8b]=260 [utility]=200)
declare -A FN=([setup]=setup [train-bf16]=train_bf16 [train-fp32]=train_fp32 [fsdp]=fsdp_smoke [fastclip]=fastclip
               [noise]=noise [scale-1b]=scale_1b [scale-8b]=scale_8b [utility]=utility)
[ "$SECOND" = 1 ] && EST[setup]=30  # the wheels stay installed on a warm machine
if [ "$PLAN_ONLY" = 1 ]; then
  est=0 lim=0
  for name in "${PLAN[@]}"; do
    printf 'PLAN %-11s estimate %4d s  timeout %4d s\n' "$name" "${EST[$name]}" "${LIMIT[$name]}"
    est=$((est + EST[$name])) lim=$((lim + LIMIT[$name]))
  done
  echo "PLAN total estimate $est s, timeouts $lim s"
  exit 0
fi

OUT=${OUT:-${OUT_DIR:-/tmp/dplora-gpu}}
mkdir -p "$OUT"
W=$(mktemp -d "${TMPDIR:-/tmp}/dplora-gpu-work.XXXXXX")
R="$W/out"  # what the stages write; the exit trap archives it
mkdir -p "$R"
SITE=${SITE:-/tmp/dplora-site}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DPLORA_CACHE_DIR="$W/cache" DPLORA_LEDGER="$W/ledger.sqlite3"
# dplora's own runs must turn Hub kernels off themselves (with kernels installed, transformers turns them on): the
# environment does not do it for them. The bench scripts build models outside dplora and get USE_HUB_KERNELS=NO.
unset USE_HUB_KERNELS
PY=${PYTHON:-python3}
D="$PY -m dplora"
t0=$(date +%s)
rc_all=0
declare -a SUMMARY=()

# finish (the exit trap): the table, the stage list and one archive of the work folder, and nothing else, to OUT.
finish() {
  local rc=$?
  trap - EXIT
  [ "$rc" = 0 ] && rc=$rc_all
  printf '%s\n' "${SUMMARY[@]}" >"$R/stages.txt"
  echo "=== summary"
  cat "$R/stages.txt"
  echo "=== table (also in $OUT/gpu_check.md)"
  $PY scripts/gpu_table.py "$R" || echo "gpu_table: FAIL (the per-stage files are in logs.tar.gz)"
  tar -czf "$OUT/logs.tar.gz" -C "$R" . || echo "logs.tar.gz: FAIL"
  cp "$R/stages.txt" "$OUT/stages.txt"
  [ -f "$R/gpu_check.md" ] && cp "$R/gpu_check.md" "$OUT/gpu_check.md"
  echo "gpu_check: $(( $(date +%s) - t0 )) s, overall exit $rc; in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  rm -rf "$W"
  exit "$rc"
}
trap finish EXIT
trap 'exit 143' TERM INT

if [ "$DRY" = 1 ]; then
  DEVICE=cpu STEPS=2 TICKETS=1000 SEQS="16" MAXB1=2 MAXB8=0 TIMEB=2 BUDGET_S=${BUDGET_S:-3600}
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  DEVICE=cuda STEPS=${STEPS:-30} TICKETS=1000 SEQS="512" MAXB1=64 MAXB8=16 TIMEB="" BUDGET_S=${BUDGET_S:-570}
  export PYTHONPATH="$SITE:$PWD"
fi
export W R SITE PY D DRY DEVICE STEPS TICKETS SEQS TIMEB MAXB1 MAXB8 GPU_DIR RECEIVED RECEIVED_WHEELS

# stage NAME POSITION: runs the stage's function under its own timeout (cut to what is left of BUDGET_S, keeping 25 s
# for the exit trap), logs to R/NAME.log; the status is the function's own (PIPESTATUS[0], not tee's).
stage() {
  local name=$1 pos=$2 fn=${FN[$1]} limit=${LIMIT[$1]}
  [ "$DRY" = 1 ] && limit=300
  local left=$(( BUDGET_S - ($(date +%s) - t0) - 25 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    SUMMARY+=("STAGE $name: SKIP (no time left of BUDGET_S=$BUDGET_S)"); echo "${SUMMARY[-1]}"; return
  fi
  case " ${GPU_CHECK_FAIL:-} " in *" $name "*) fn=fail_on_purpose ;; esac
  local s0; s0=$(date +%s)
  echo "=== $name (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$fn" 2>&1 | tee "$R/$name.log"
  local rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - s0 ))
  if [ "$rc" = 0 ]; then
    SUMMARY+=("STAGE $name: OK (${took}s)")
  else
    [ "$rc" = 124 ] && rc="$rc, timed out"
    SUMMARY+=("STAGE $name: FAIL (exit $rc, ${took}s)")
    [ "$rc_all" = 0 ] && rc_all=$((10 + pos))
  fi
  echo "${SUMMARY[-1]}"
}

fail_on_purpose() { echo "GPU_CHECK_FAIL names this stage: failing on purpose"; return 3; }

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

# install_wheels: every carried wheel into $SITE, skipped when the same wheels are already there (a warm machine's
# second call). pip's own status decides; its output goes to a log that is shown only on failure.
install_wheels() {
  local wheels=() stamp
  shopt -s nullglob
  wheels=("$GPU_DIR"/wheels/*.whl "$GPU_DIR"/wheels-stack/*.whl "$RECEIVED_WHEELS"/*.whl)
  shopt -u nullglob
  [ "${#wheels[@]}" -gt 0 ] || { echo "no wheels in $GPU_DIR/wheels*: run scripts/gpu_prepare.sh and carry them"; return 1; }
  stamp=$(printf '%s\n' "${wheels[@]##*/}" | sort | sha256sum | cut -c1-16)
  if [ -f "$SITE/.dplora-wheels" ] && [ "$(cat "$SITE/.dplora-wheels")" = "$stamp" ]; then
    echo "wheels: ${#wheels[@]} already in $SITE"; return 0
  fi
  if ! $PY -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "${wheels[@]}" >"$R/pip.log" 2>&1; then
    echo "pip install: FAIL"; tail -n 20 "$R/pip.log"; return 1
  fi
  echo "$stamp" >"$SITE/.dplora-wheels"
  echo "wheels: ${#wheels[@]} installed into $SITE"
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
  else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    install_wheels || return 1
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
  # the stack the stages run on: transformers and kernels as users install them (Hub kernels stay off in dplora)
  $PY - <<'PY' || return 1
import importlib.metadata as md
import torch
names = ["transformers", "kernels", "peft", "accelerate", "huggingface_hub", "opacus", "bitsandbytes"]
def version(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return "absent"
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), *(f"{n} {version(n)}" for n in names))
PY
  [ "$DRY" = 1 ] && return 0  # the dry run wrote the tickets and the key above (two CLI starts saved)
  $D demo-data "$W/tickets.csv" --tickets "$TICKETS" --overwrite >/dev/null || return $?
  $D keygen "$W/signing.key" >/dev/null || return $?
}

# train_run NAME OVERRIDES...: dplora train + verify on the setup's 135M (dry run: the tiny Llama); the per-example
# check's margin and the probed physical batch are echoed from the run's log for the output's last 12,000 characters.
train_run() {
  local name=$1; shift
  local dry=()
  # dry run: ε 2 gives σ ≈ 1 at T 2, whose attack-ceiling PLD (record and verify) takes under a second, not ~5 s
  [ "$DRY" = 1 ] && dry=(privacy.accountant=rdp privacy.target_epsilon=2 training.expected_batch_size=4
                         training.max_seq_len=32 training.threads=1)
  $D train configs/demo.yaml --signing-key "$W/signing.key" --no-progress model.name=null \
    "model.path=$W/model" "data.path=$W/tickets.csv" "training.output_dir=$W/run-$name" "$@" "${dry[@]}" \
    >"$R/train-$name.txt" 2>&1
  local rc=$?
  grep -E "per-example check|physical batch|peak" "$R/train-$name.txt"
  [ "$rc" = 0 ] || { tail -n 20 "$R/train-$name.txt"; return "$rc"; }
  $D verify "$W/run-$name" --public-key "$W/signing.pub" >"$R/verify-$name.txt" 2>&1 ||
    { rc=$?; tail -n 20 "$R/verify-$name.txt"; return "$rc"; }
  grep -E "^(OK  signature|execution:)" "$R/verify-$name.txt"
}

train_bf16() {  # the auto probe (64, 32, … on CUDA; 8 on CPU) chooses the physical batch
  local seq=(training.max_seq_len=128)
  [ "$DRY" = 1 ] && seq=()
  train_run bf16 model.dtype=bf16 training.physical_batch_size=auto "training.steps=$STEPS" "${seq[@]}"
}

train_fp32() {  # fp32 weights, TF32 matmuls in the steps; the per-example check runs with TF32 off
  local extra=(training.physical_batch_size=16 training.max_seq_len=128 training.steps=10)
  [ "$DRY" = 1 ] && extra=(training.physical_batch_size=2 "training.steps=$STEPS")
  train_run fp32 model.dtype=fp32 model.allow_tf32=true "${extra[@]}"
}

fsdp_smoke() {  # training.sharding: fsdp at world size 1: NCCL on CUDA, gloo in the dry run
  local extra=(training.physical_batch_size=2)
  [ "$DRY" = 1 ] || extra=(training.physical_batch_size=16 training.max_seq_len=128 training.gradient_checkpointing=true)
  train_run fsdp model.dtype=bf16 training.sharding=fsdp "training.steps=$STEPS" "${extra[@]}"
}

fastclip() {
  if [ "$DRY" = 1 ]; then
    $PY scripts/check_fastclip.py --device cpu --layers 1 --dtypes fp32 --toy
  else
    USE_HUB_KERNELS=NO $PY scripts/check_fastclip.py --device cuda
  fi
}

scale() {  # scale ARCH NAME MAX_BATCH [DRY-RUN VARIANTS...]
  local arch=$1 name=$2 maxb=$3 extra=(); shift 3
  # dry run: the toy shape, one step; each variant runs once across the two calls (1b: plain 4bit, 8b: ckpt)
  if [ "$DRY" = 1 ]; then arch=toy; extra=(--steps 1 --warmup 0 --variants "$@"); fi
  [ "$DRY" = 1 ] || [ "$name" != llama-1b ] || extra=(--variants plain 4bit)
  # shellcheck disable=SC2086
  USE_HUB_KERNELS=NO $PY scripts/bench_scale.py --arch "$arch" --device "$DEVICE" --seqs $SEQS --max-batch "$maxb" \
    ${TIMEB:+--batch $TIMEB} --out "$R/scale-$name" "${extra[@]}"
}
scale_1b() { scale llama-1b llama-1b "$MAXB1" plain 4bit; }
scale_8b() { scale llama-8b llama-8b "$MAXB8" ckpt; }

utility() {  # the --full design (issue 33), sized to the device budget; real weights cannot travel: random init
  if [ "$DRY" = 1 ]; then
    $PY scripts/utility_bench.py --toy --full --only bitext --epsilons 8 --repeats 1 --threads 1 --max-steps 10 \
      --out "$R/utility" >"$R/utility.txt" 2>&1 || { local rc=$?; tail -n 20 "$R/utility.txt"; return "$rc"; }
    tail -n 12 "$R/utility/utility.md"
  else
    [ -d "$GPU_DIR/data" ] && export DPLORA_UTILITY_DATA=$(cd "$GPU_DIR/data" && pwd)
    if [ -n "${UTILITY_STUDY:-}" ]; then  # frontier rows too long for the CPU stage (docs/utility.md): one lever each
      local lever
      for lever in $UTILITY_STUDY; do
        $PY scripts/utility_bench.py --study "$lever" --only bitext --model-path "$W/model" --out "$R/utility" || return
      done
      return 0
    fi
    $PY scripts/utility_bench.py --full --only bitext --epsilons 8 --repeats 1 --max-train-rows 1600 \
      --model-path "$W/model" --out "$R/utility"
  fi
}

noise() {
  if [ "$DRY" = 1 ]; then
    $PY scripts/bench_noise.py --device cpu --sizes 20000 --compare-values 4096 --json "$R/noise.json"
  else
    $PY scripts/bench_noise.py --device cuda --json "$R/noise.json"
  fi
}

export -f fail_on_purpose join_weights install_wheels setup train_run train_bf16 train_fp32 fsdp_smoke fastclip \
  scale scale_1b scale_8b utility noise
est=0
for name in "${PLAN[@]}"; do est=$((est + EST[$name])); done
echo "gpu_check: call $([ "$SECOND" = 1 ] && echo 2 || echo 1), stages ${PLAN[*]}; estimated GPU total $est s"
# the dry run's utility stage reads Bitext where utility_bench.py does; a fresh clone has no ../shared beside it
BITEXT_DIR="${DPLORA_UTILITY_DATA:-../shared/data}/bitext_customer_support"
pos=0
for name in "${PLAN[@]}"; do
  if [ "$name" != setup ] && [ "${SUMMARY[0]%% (*}" != "STAGE setup: OK" ]; then
    SUMMARY+=("STAGE $name: SKIP (setup failed)")
  elif [ "$name" != setup ] && [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
    SUMMARY+=("STAGE $name: SKIP (not in GPU_CHECK_ONLY)")
  elif [ "$name" = utility ] && [ "$DRY" = 1 ] && [ ! -d "$BITEXT_DIR" ]; then
    SUMMARY+=("STAGE utility: SKIP (no Bitext data at $BITEXT_DIR)")
  else
    stage "$name" "$pos"
    pos=$((pos + 1))
    continue
  fi
  echo "${SUMMARY[-1]}"
  pos=$((pos + 1))
done
exit "$rc_all"
