"""Known-harmless noise of vLLM, torch and torchao on this CPU set-up, silenced where it starts.

Rule: each :class:`Rule` names one message, the logger that emits it and why it is harmless here; a
record is dropped only when it comes from that logger *and* contains every piece of the rule's text, so
everything else stays visible. :func:`install` runs in every process vLLM starts (from the plugin's
``register``) and in the ``fp8rl`` command; rules are tied to the versions pinned in ``constraints.txt``
(``tests/core/sampler/test_quiet.py`` shows which a real engine start still needs).
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass

__all__ = ["ENV", "RULES", "SHUTDOWN_S", "WARNINGS", "KnownHarmless", "Rule", "install"]


@dataclass(frozen=True)
class Rule:
    """Drop records of ``logger`` whose message contains every string in ``text``; ``why`` is harmless."""

    logger: str
    text: tuple[str, ...]
    why: str

    def matches(self, record: logging.LogRecord) -> bool:
        if record.name != self.logger:
            return False
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 — a malformed record is not ours to judge; keep it
            return False
        return all(t in message for t in self.text)


RULES: tuple[Rule, ...] = (
    Rule("torchao", ("Failed to load", "torchao/_C_"),
         "torchao's prebuilt CUDA kernels (_C_mxfp8, _C_cutlass_90a) cannot load into the CPU build of torch; "
         "torchao is imported only because transformers probes it, and fp8rl calls none of its kernels"),
    Rule("torch.utils._pytree", ("is an Enum subclass", "register_constant() on Enum subclasses is deprecated"),
         "torchao 0.18 registers its config Enums as pytree constants at import, which torch 2.13 deprecates "
         "(a note to torchao); nothing in fp8rl compiles with those Enums"),
    Rule("vllm.renderers.base", ("Chat template warmup failed",),
         "the sampler starts vLLM with skip_tokenizer_init=True and sends token ids only, never chat requests; "
         "the warm-up renders a chat template, which needs the tokenizer the engine deliberately lacks"),
    Rule("vllm.model_executor.model_loader.reload.layerwise", ("RotaryEmbedding: Failed to load weights",),
         "a rotary embedding has no checkpoint weights (its cos/sin cache is computed at start); on every "
         "in-place weight reload (each sync) vLLM finds nothing to load for it and puts the computed cache back"),
    Rule("vllm.v1.worker.cpu_worker", ("is not found in LD_PRELOAD",),
         "a performance hint (preload tcmalloc / Intel OpenMP on a production host); it changes no result, and "
         "the lab's timings compare presets on the same allocator"),
    Rule("vllm.v1.worker.cpu_worker", ("doesn't allow to use `torch.set_num_threads` after the thread binding",),
         "an in-process engine (SamplerConfig.process='in-process') starts vLLM's CPU worker in the calling process; the "
         "worker replaces torch.set_num_threads with this warning, and vLLM's own start-up then calls it a few "
         "times; fp8rl puts the real function and the thread count back after the start "
         "(fp8rl_core.sampler.vllm.compat.in_process_engine)"),
    Rule("vllm.platforms.cpu", ("Triton is not installed",),
         "a performance hint: vLLM's CPU path runs without Triton kernels here (enforce_eager, fp8rl's own "
         "quantized GEMMs); no result depends on it"),
    Rule("vllm.triton_utils.importing", ("Triton is installed, but doesn't include CPU backend",),
         "the same: the CPU wheel ships Triton without its CPU backend and vLLM simply does not use it"),
    Rule("vllm.config.vllm", ("Model Runner V2 requires Triton",),
         "without Triton vLLM picks its V1 model runner, the one this project is tested with"),
    Rule("vllm.config.vllm", ("Enforce eager set, disabling torch.compile",),
         "the sampler asks for enforce_eager=True on purpose (no compilation: quick starts, exact eager numerics)"),
    Rule("vllm.config.vllm", ("Inductor compilation was disabled by user settings",),
         "the same request (enforce_eager) seen from the compilation settings"),
    Rule("vllm.renderers.base", ("EOS token id because tokenizer is not initialized",),
         "the engine has no tokenizer on purpose (skip_tokenizer_init=True); every request names its stop "
         "token ids itself (VllmSampler.generate)"),
    Rule("vllm.model_executor.layers.utils", ("Failed to create oneDNN linear, fallback to torch linear",),
         "on CPUs without oneDNN's primitive for the dtype, vLLM's BF16 layers run torch's own linear instead of "
         "oneDNN's: the same product by another kernel; fp8rl's grid layers use their own GEMM either way"),
)

#: Seconds an engine gets to stop (``VllmSampler.close``) and its engine core to stop its workers
#: (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``, read by the engine core it is inherited by). vLLM's 5 s
#: default is short on a loaded 2-core machine: a process still alive then is SIGKILLed ("force killing
#: remaining processes"), so it never unlinks its shared-memory message queues (``/dev/shm/psm_*``,
#: 160-250 MB each) — they stay allocated until the sweep exits and Python's resource tracker reports
#: them as leaked. A process that stops in time unlinks its own.
SHUTDOWN_S = 60
ENV = {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": str(SHUTDOWN_S)}

#: Python warnings (``warnings.warn``) that are harmless here: (message regex, category, module regex, why)
WARNINGS: tuple[tuple[str, type[Warning], str, str], ...] = (
    (r"`torch\.distributed\.reduce_op` is deprecated", FutureWarning, r"vllm\.triton_utils",
     "vLLM's Triton dispatcher walks torch.distributed's attributes at import and touches the deprecated alias; "
     "nothing calls it"),
)


class KnownHarmless(logging.Filter):
    """A logger filter that drops the records one of ``rules`` matches (see :func:`install`)."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        super().__init__()
        self.rules = rules

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(r.matches(record) for r in self.rules)


def install(rules: tuple[Rule, ...] = RULES) -> None:
    """Add a :class:`KnownHarmless` filter to each logger named in ``rules`` (once per logger per process)
    and ignore the Python warnings in :data:`WARNINGS`; set :data:`ENV` where the environment does not.

    A sampler run on CPU makes these libraries print lines that say nothing about the run: CUDA kernels that
    cannot load into a CPU build, a deprecation aimed at torchao, performance hints for a tuned production host,
    a chat-template warm-up for an engine that has no tokenizer on purpose, and a reload note for a layer that
    has no weights. Each :class:`Rule` below names one such message, the logger that emits it and why it is
    harmless here; a record is dropped only when it comes from that logger *and* contains every piece of the
    rule's text, so anything else these libraries log — including other warnings of the same loggers — stays
    visible.

    :func:`install` puts the rules in place as filters on those loggers (stdlib only; it imports none of the
    libraries, so it can run before them and catch their import-time lines). A filter is per process: vLLM runs
    its engine core and worker in processes of their own (spawned), so it must run in each —
    :func:`fp8rl_core.sampler.vllm.plugin.register` calls it (vLLM calls that in every process it starts) and the
    ``fp8rl`` command calls it at import (a spawned process re-imports the main module before anything else, so
    the import-time lines of the child processes are caught too). :func:`install` is idempotent.

    :data:`ENV` is the one environment default set here (inherited by the engine processes): the time an engine
    gets to stop, so that it frees its shared memory itself (see :data:`SHUTDOWN_S`).

    Each rule is tied to the library versions pinned in ``constraints.txt``; when a message changes or goes away
    with an upgrade its rule simply stops matching (``tests/core/sampler/test_quiet.py`` shows which rules a
    real engine start still needs).
    """
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    for message, category, module, _ in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in sorted({r.logger for r in rules}):
        logger = logging.getLogger(name)
        mine = tuple(r for r in rules if r.logger == name)
        if not any(isinstance(f, KnownHarmless) and f.rules == mine for f in logger.filters):
            logger.addFilter(KnownHarmless(mine))
