# The two commands a new user needs: `make quickstart` and `make test`. Both set up .venv first.
# torch is installed FIRST and pinned (constraints.txt): anything that pulled a newer torch would
# download GBs of CUDA wheels.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/$(VENV)/torch_extensions
export WANDB_MODE ?= offline

.PHONY: setup test test-cluster test-gpu quickstart quickstart-rotary eval-tasks docs lint clean

PACKAGE := $(VENV)/.package
setup: $(STAMP) $(PACKAGE)

# This checkout as an editable package (pyproject.toml): megatron/, study/ and benchmarks/ import from
# anywhere with the venv's python, so tools/*.py need no sys.path lines. One venv per checkout.
# "compat" mode puts the checkout on sys.path: megatron-core's namespace `megatron.core` in
# site-packages would otherwise hide our regular `megatron` from setuptools' strict finder.
$(PACKAGE): pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet --no-deps -e . --config-settings editable_mode=compat
	touch $(PACKAGE)

$(STAMP): requirements.txt constraints.txt
	@echo "setup 1/4: creating $(VENV)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setup 2/4: installing torch 2.13.0 (CPU wheel; a few minutes on a fresh machine)"
	$(PY) -m pip install --quiet torch==2.13.0
	@echo "setup 3/4: installing requirements.txt under constraints.txt (DeepSpeed, transformers, ...)"
	DS_BUILD_OPS=0 PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(PY) -m pip install --quiet -c constraints.txt -r requirements.txt
	@echo "setup 4/4: building DeepSpeed's shared-memory comm op once (1-2 min), so no run builds it again"
	# DeepSpeed JIT-builds its shared-memory comm op at every process-group start; build it once now.
	PYTHONPATH=$(CURDIR) $(PY) tools/build_deepspeed_ops.py
	touch $(STAMP)
	@echo "setup done: $(VENV)"

# The suite in TEST_WORKERS processes of one thread each (pytest-xdist): on the 2-core CI machine
# 7.5 min instead of 13.7 in one process of two threads.
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/ruff check .
	$(PY) tools/gen_config_docs.py --check
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15 --ignore=tests/cluster tests

# The multi-host tests (tests/cluster/): two hosts built as Linux network namespaces on a private
# bridge, each with its own hostname, sshd, munged and slurmd (slurmctld on the first); pdsh and
# Slurm runs across them, a host crashed or cut off, signals, pre-emption. Needs root (CI is);
# apt-gets openssh-server, pdsh, slurm-wlm and munge when missing. Everything it makes is removed.
test-cluster: setup
	@why=$$($(PY) -m tests.cluster.netns_cluster --install --check) || { echo "make test-cluster: no test cluster on this machine: $$why"; exit 1; }
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=10 tests/cluster

# The CUDA-relevant part of the suite on a GPU machine (tests marked `gpu`: compiled Triton kernels at
# real sizes, flex and flash on CUDA, MFU, and tests/gpu/: the paper config through deepy.py in bf16,
# SIGKILL and exact resume, evaluate/generate/HF export on CUDA). `make test` runs everything else
# there too, with the CPU pinned where a test is about CPU behaviour.
# One worker per CPU core: most of its time is compiling Triton kernels, which is CPU work
# (16 workers on one H200: ~4 minutes). worksteal: the longest tests come last in collection order.
TEST_GPU_WORKERS ?= auto
test-gpu: setup
	@$(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: torch sees no GPU on this machine; run make test')"
	$(PY) -m pytest -q --durations=15 -n $(TEST_GPU_WORKERS) --dist worksteal -m gpu tests

# Real data (the Python standard library on this machine), a small KERPLE-log model, then the
# extrapolation table at 1x..16x the train length. Re-running resumes from the saved checkpoint
# and evaluates it again: --overwrite replaces the earlier table (evaluate.py keeps it otherwise).
quickstart: setup
	$(PY) tools/prepare_data.py stdlib --data-dir data
	$(PY) deepy.py train.py configs/quickstart.yml
	$(PY) evaluate.py --checkpoint runs/quickstart/checkpoints --max-factor 16 --max-tokens 65536 --window-order contiguous \
		--batch-size 4 --quiet --overwrite
	$(PY) tools/check_figures.py quickstart
	$(PY) tools/compare_runs.py runs/quickstart runs/quickstart_rotary --out runs/compare --missing-ok \
		--missing-hint "make quickstart-rotary"

# The same run with rotary positions (one extra YAML), for contrast.
quickstart-rotary: setup
	$(PY) tools/prepare_data.py stdlib --data-dir data
	$(PY) deepy.py train.py configs/quickstart.yml configs/quickstart_rotary.yml
	$(PY) evaluate.py --checkpoint runs/quickstart_rotary/checkpoints --max-factor 16 --max-tokens 65536 --window-order contiguous \
		--batch-size 4 --quiet --overwrite
	$(PY) tools/check_figures.py quickstart_rotary
	$(PY) tools/compare_runs.py runs/quickstart runs/quickstart_rotary --out runs/compare --missing-ok \
		--missing-hint "make quickstart"

# Downstream tasks (lm-evaluation-harness), offline: the local tasks built from held-out stdlib
# docstrings (megatron/evaluation/harness/local_tasks.py) on the checkpoint `make quickstart` left;
# harness.json goes beside its eval.json, in runs/quickstart/eval/ (where `deepy.py eval.py` puts it too).
# RULER beside them: make eval-tasks RULER="niah_single_1 ruler_vt" RULER_LENGTHS=1024,2048
# (the offline RULER tasks at those lengths; docs/evaluation.md, "RULER").
RULER ?=
RULER_LENGTHS ?=
eval-tasks: setup
	@test -f runs/quickstart/checkpoints/latest || { echo "eval-tasks: no checkpoint in runs/quickstart/checkpoints: run 'make quickstart' first" >&2; exit 2; }
	$(PY) eval.py configs/quickstart.yml --eval_tasks kerple_local $(RULER) \
		$(if $(RULER_LENGTHS),--ruler-lengths $(RULER_LENGTHS)) --quiet --overwrite

docs: setup
	$(PY) tools/gen_config_docs.py

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs
