#!/usr/bin/env bash
# The main job on the built-in default: project-generated tickets, the packaged SmolLM2-135M, a demo key.
set -euo pipefail
cd "$(dirname "$0")/.."
D=.venv/bin/dplora
$D demo-data demo/tickets.csv --tickets 1000 --overwrite
[ -f demo/signing.key ] || $D keygen demo/signing.key
$D budget configs/demo.yaml
$D train configs/demo.yaml --signing-key demo/signing.key --overwrite
$D verify demo/run --public-key demo/signing.pub
$D generate demo/run --public-key demo/signing.pub --prompt "I was charged twice for my last order, can you refund one of the charges?" --max-new-tokens 48
