#!/usr/bin/env bash
# Prepare .gpu/ (git-ignored) for scripts/gpu_check.sh on a GPU machine without internet: cp312 wheels of the
# packages that machine lacks (see ../shared/NOTES.md) and SmolLM2-135M's config and tokenizer files (no weights:
# the check builds a random-init model of the same architecture). Run here, from the repository root, after setup.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu/wheels .gpu/smollm2
grep -qs '^/.gpu/' .git/info/exclude || { mkdir -p .git/info && echo '/.gpu/' >>.git/info/exclude; }
.venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/wheels \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 opacus==1.6.0 datasets==5.2.0 dill multiprocess dp-accounting==0.6.0 dm-tree \
  cryptography cffi pycparser pydantic==2.14.4 pydantic-core annotated-types typing-inspection typing-extensions \
  gguf xxhash securesystemslib bitsandbytes==0.50.2
folder=$(.venv/bin/python -c "from dplora.engine.model import converted_smollm2; print(converted_smollm2())")
find "$folder" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} .gpu/smollm2/ \;
# the utility stage's data (Banking77, Bitext: 4.6 MB of public csv) read by utility_bench.py via DPLORA_UTILITY_DATA
mkdir -p .gpu/data && cp -r ../shared/data/banking77 ../shared/data/bitext_customer_support .gpu/data/
du -sh .gpu
