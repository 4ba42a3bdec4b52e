"""The known-harmless noise rules: each drops exactly its message from its logger and nothing else, and
on the pinned libraries they silence the real import-time lines (a fresh interpreter importing torchao)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from fp8rl_core.sampler.vllm import quiet

# (logger, format, args) as the libraries log them (torch/utils/_pytree.py, torchao/__init__.py,
# vllm/renderers/base.py, vllm/model_executor/model_loader/reload/layerwise.py, vllm/v1/worker/cpu_worker.py,
# vllm/platforms/cpu.py)
HARMLESS = [
    ("torchao", "Failed to load %s: %s", ("/venv/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so",
                                          "Could not load this library")),
    ("torch.utils._pytree", "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value "
     "type. Calling register_constant() on Enum subclasses is deprecated and will be an error in a future release.",
     ("<enum 'KernelPreference'>",)),
    ("vllm.renderers.base", "Chat template warmup failed", ()),
    ("vllm.model_executor.model_loader.reload.layerwise", "%s: Failed to load weights", ("RotaryEmbedding",)),
    ("vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD. For best performance, please follow ...", ("libtcmalloc",)),
    ("vllm.v1.worker.cpu_worker", "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, "
     "skip it.", ()),
    ("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs.", ()),
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend. Disabling Triton.", ()),
    ("vllm.config.vllm", "Model Runner V2 requires Triton; using the V1 model runner instead.", ()),
    ("vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. ...", ()),
    ("vllm.config.vllm", "Inductor compilation was disabled by user settings, optimizations ...", ()),
    ("vllm.renderers.base", "Using None for EOS token id because tokenizer is not initialized", ()),
    ("vllm.model_executor.layers.utils", "Failed to create oneDNN linear, fallback to torch linear. Exception: %s",
     ("could not create a primitive descriptor for the matmul primitive",)),
]
# near misses that must stay visible: another layer failing to load, another torchao failure, the same
# text from another logger
REAL = [
    ("vllm.model_executor.model_loader.reload.layerwise", "%s: Failed to load weights", ("QKVParallelLinear",)),
    ("torchao", "Skipping import of cpp extensions: %s", ("boom",)),
    ("vllm.engine", "Chat template warmup failed", ()),
    ("torch.utils._pytree", "%s cannot be registered as a pytree", ("<class 'X'>",)),
    ("vllm.config.vllm", "Chunked prefill is enabled with max_num_batched_tokens=%d", (8,)),
]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@pytest.fixture()
def records():
    quiet.install()
    names = {n for n, _, _ in HARMLESS + REAL}
    handler = Records()
    loggers = [logging.getLogger(n) for n in names]
    for lg in loggers:
        lg.addHandler(handler)
    yield handler
    for lg in loggers:
        lg.removeHandler(handler)


def test_each_rule_drops_its_message_and_keeps_near_misses(records):
    for name, fmt, args in HARMLESS:
        logging.getLogger(name).warning(fmt, *args)
    assert records.seen == []
    for name, fmt, args in REAL:
        logging.getLogger(name).warning(fmt, *args)
    assert records.seen == [fmt % args for _, fmt, args in REAL]


def test_every_rule_is_exercised_here():
    assert sorted(r.logger for r in quiet.RULES) == sorted(n for n, _, _ in HARMLESS)
    assert len(quiet.RULES) == len(HARMLESS)
    assert all(r.why for r in quiet.RULES)


def test_install_is_idempotent():
    quiet.install()
    quiet.install()
    for name in {r.logger for r in quiet.RULES}:
        assert sum(isinstance(f, quiet.KnownHarmless) for f in logging.getLogger(name).filters) == 1


def _import_torchao(install: bool) -> str:
    code = ("from fp8rl_core.sampler.vllm import quiet\n" + ("quiet.install()\n" if install else "") + "import torchao\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr


def test_the_rules_silence_the_real_import_lines_of_the_pinned_torchao():
    loud = _import_torchao(install=False)
    assert "_C_mxfp8" in loud and "is an Enum subclass" in loud  # the lines the rules exist for are still there
    assert _import_torchao(install=True) == ""
