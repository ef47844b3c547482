# Two commands do all the set-up: `make demo` and `make test` create .venv on first use.
# torch==2.13.0 is installed first and exactly: a looser spec would pull another release.
# PyPI's Linux wheel of it is the CUDA 13.0 build (docs/gpu.md); a CPU machine's pip
# configuration may point at a CPU wheel instead.
# `make test` adds the engines it tests for real: DeepSpeed from PyPI, and Horovod 0.28.1
# built against this torch by scripts/build_horovod.sh (the wheel is cached under
# ~/.cache/dalle_dist/wheels, so only the first build on a machine takes minutes).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed
ENGINES := $(VENV)/.installed-engines
DEMO_DIR ?= demo

DEEPSPEED := $(VENV)/.installed-deepspeed
# DALLE-pytorch 1.6.6 and what its model and default tokenizer import, for the tests that
# compare checkpoint import/export with it (installed --no-deps by the engines step)
REFERENCE := dalle-pytorch==1.6.6 rotary-embedding-torch==0.9.1 axial_positional_embedding==0.3.12 \
	ftfy==6.3.1 regex wcwidth
GPU_CHECK_OUT ?= gpu-acceptance.json
# torch-fidelity's source (see the engines step)
FIDELITY_SRC := $(VENV)/reference/torch-fidelity

# The suite runs on two pytest-xdist workers: the 2-rank launch tests in one (in order, so
# two launches never share the two cores), the single-process tests in the other
# (tests/conftest.py). PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/pytest -q -n $(PYTEST_WORKERS) --no-loadscope-reorder

.PHONY: demo test test-quick lint bench gpu-check gpu-check-quick clean slurm-wlm

$(BASE): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BASE)

$(DEEPSPEED): $(BASE)
	$(BIN)/pip install --quiet -e '.[dev,deepspeed]'
	touch $(DEEPSPEED)

$(ENGINES): $(BASE) scripts/build_horovod.sh
	scripts/build_horovod.sh $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,deepspeed,horovod,webdataset,tensorboard,wandb,fid,clip]'
	# the yttm extra: youtokentome's build imports Cython (and setuptools) without declaring them
	$(BIN)/pip install --quiet Cython setuptools wheel
	$(BIN)/pip install --quiet --no-build-isolation 'youtokentome>=1.0.6'
	# DALLE-pytorch itself, for the checkpoint import/export tests (tests/checkpoint/
	# dalle_pytorch_reference.py): its DALLE and DiscreteVAE need only the next two, its
	# default tokenizer ftfy and regex; --no-deps keeps out torchvision, DALL-E, taming and
	# transformers
	$(BIN)/pip install --quiet --no-deps $(REFERENCE)
	# torch-fidelity's source, unpacked and not installed (it imports torchvision, and an
	# installed copy makes torchmetrics take that path): tests/train/test_quality.py checks
	# model/inception.py against its Inception network
	rm -rf $(FIDELITY_SRC) && mkdir -p $(FIDELITY_SRC)
	$(BIN)/pip download --quiet --no-deps --dest $(FIDELITY_SRC) torch-fidelity==0.4.0
	$(BIN)/python -m zipfile -e $(FIDELITY_SRC)/torch_fidelity-0.4.0-py3-none-any.whl $(FIDELITY_SRC)
	touch $(ENGINES)

# Trains a VAE (or reuses the cached one) and DALL-E on the built-in shapes, then prints
# "caption fidelity: F over N images" as its last line.
demo: $(BASE)
	$(BIN)/dalle-dist train --dalle_output_file_name $(DEMO_DIR)/dalle --overwrite

lint: $(BASE)
	$(BIN)/ruff check src tests bench

# Every run ends with its wall time and its slowest files and fixtures (tests/timing.py),
# then the slowest tests (--durations): a slow new test shows in every CI log at once.
test: $(ENGINES) lint slurm-wlm
	$(PYTEST) --durations=20

# Debian's slurm-wlm for the real-Slurm tests (tests/slurm/: scripts/slurm_local.sh runs a
# one-node cluster from it): installed with apt-get where it is missing and this is root on
# Debian; elsewhere those tests fail with the line to install it.
slurm-wlm:
	@command -v slurmctld >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm >/dev/null 2>&1; }; }; } \
		|| echo "slurm-wlm is not installed: the Slurm tests will fail (apt-get install slurm-wlm)"

# The inner loop between edits: unit tests and single-process checks, no 2-rank launch and
# no minutes-long training (markers ranks and slow); `make test` still runs everything.
test-quick: $(ENGINES)
	$(PYTEST) -m "not ranks and not slow"

bench: $(BASE)
	$(BIN)/python bench/train_step.py

# The acceptance run for a GPU machine: `dalle-dist selftest`, the installed command a
# pip-installed user runs too (src/dalle_dist/selftest). One PASS / FAIL / "not run" line per
# check, the report in $(GPU_CHECK_OUT), exit status 1 when a check fails; at most 10.5
# minutes on one GPU, start-up included (gpu-check-quick: every backend and precision once,
# at most 5.5 minutes; run it first when GPU time is short). With 2 or more GPUs it also checks N
# ranks of each backend against one process, and a hung rank. Without a GPU it runs the
# CPU checks (its --device cpu --quick form is part of `make test`: tests/test_selftest.py).
# PyPI's torch for Linux is the CUDA build: nothing else to install (docs/gpu.md).
gpu-check: $(DEEPSPEED)
	$(BIN)/dalle-dist selftest --out $(GPU_CHECK_OUT)

gpu-check-quick: $(DEEPSPEED)
	$(BIN)/dalle-dist selftest --quick --out $(GPU_CHECK_OUT:.json=-quick.json)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .ruff_cache $(GPU_CHECK_OUT) \
		$(GPU_CHECK_OUT:.json=-quick.json) selftest.json
