#!/usr/bin/env bash
# OpenVINO for bench_real_llm.py's peer rows: optimum-intel with NNCF and OpenVINO, in a virtualenv of their own
# (optimum-intel 2.2.0 wants transformers below 5.6, which the project's is past). The CPU build of torch pinned in
# constraints.txt goes in first, as the Makefile installs it, so nothing pulls a CUDA build; torchvision, which
# optimum-intel requires for its image models only, comes out again: PyPI's is built against the CUDA torch, and
# beside the CPU one it breaks transformers' imports ("operator torchvision::nms does not exist").
#   benchmarks/install_openvino.sh [DIR]   -> prints the python to pass as --openvino-python
set -euo pipefail
DIR=${1:-${TMPDIR:-/tmp}/openvino}
PYTHON=${PYTHON:-python3.11}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV="$DIR/openvino-venv"
mkdir -p "$DIR"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet -c "$ROOT/constraints.txt" torch
"$VENV/bin/pip" install --quiet -c "$ROOT/constraints.txt" "optimum-intel[openvino]==2.2.0" "optimum==2.3.0" \
    "nncf==3.4.0" "openvino==2026.4.1" "openvino-tokenizers==2026.4.1.0" "transformers==5.5.4"
"$VENV/bin/pip" uninstall --quiet -y torchvision
"$VENV/bin/python" -c "from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig"
echo "$VENV/bin/python"
