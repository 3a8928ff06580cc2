#!/usr/bin/env bash
# infopt on a GPU machine in about 5 minutes: install from the working tree with the wheels in .whl/
# (../shared/GPU.md says which), then side by side: `pytest -m gpu`, and three builds as a user runs
# them for --target h100 (the digits CNN at fp16, a tiny transformers Llama at bf16 and at int4), each
# under faulthandler. Run from the project root on the GPU machine:
#   bash benchmarks/gpu_check.sh            (logs under $OUT, else /tmp/gpu-check; a summary last)
set -u
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
echo "CXX=${CXX:-unset}; g++ on PATH: $(command -v g++)"
python3 -m infopt.cli doctor --json > "$OUT/doctor.json" 2> /dev/null
python3 -c "import json, sys; rows = {r['component']: r for r in json.load(open(sys.argv[1]))}; r = rows['C++ compiler (AOTInductor)']; print('C++ compiler for packages:', r['ok'], r['detail'])" "$OUT/doctor.json"
python3 -m examples.train --out /tmp/ex > /tmp/train.txt 2>&1 || tail -20 /tmp/train.txt
(cd /tmp && python3 -c "
import torch, transformers as T
torch.manual_seed(0)
T.LlamaForCausalLM(T.LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
    intermediate_size=512, vocab_size=1000, max_position_embeddings=256)).eval().save_pretrained('tinyllama')" > /tmp/tinyllama.txt 2>&1 || tail -20 /tmp/tinyllama.txt)
el "models made; pytest -m gpu and the builds side by side"
(timeout 240 python3 -X faulthandler -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/optimize/test_cuda_graphs.py \
   tests/passes/test_aoti_compile.py tests/e2e/test_backends_e2e.py > "$OUT/pytest_gpu.txt" 2>&1; echo "rc=$?" >> "$OUT/pytest_gpu.txt") &
i=0
for args in "ex/digits_cnn.pt --input x:float32[batch,1,8,8] --val ex/digits_val.npz --fp16" "tinyllama --task logits --bf16" "tinyllama --task logits --int4"; do
  i=$((i+1))
  (cd /tmp && timeout 240 python3 -X faulthandler -m infopt.cli build $args --target h100 --output "/tmp/d-$i" --force > "$OUT/build_$i.txt" 2>&1
   echo "rc=$?" >> "$OUT/build_$i.txt") &
done
wait
el "done"
for i in 1 2 3; do echo "== build $i ($OUT/build_$i.txt)"; grep -v "pass .* (\|pass .* done" "$OUT/build_$i.txt" | tail -12; done
echo "== pytest -m gpu"; grep -v DEBUG "$OUT/pytest_gpu.txt" | tail -15
