"""The vLLM 0.32 workarounds (fp8rl_core.sampler.vllm.compat): the watchdog fails a call whose engine core
died, and a test that tells when vLLM no longer needs it. No engine is started here."""

from __future__ import annotations

import inspect
import multiprocessing as mp
import threading
from concurrent.futures import Future
from queue import Queue
from types import SimpleNamespace

import pytest

from fp8rl_core.sampler.vllm.compat import EngineCoreDied, engine_core_alive, watched_call


def test_vllm_still_leaves_a_dead_engines_pending_waits_unresolved():
    """Why the watchdog exists. When this test fails, vLLM's monitor resolves pending waits itself (or
    waits take a timeout): drop ``watched_call`` / ``fail_pending_waits`` and call the client directly."""
    from vllm.v1.engine.core_client import MPClient, SyncMPClient

    monitor = inspect.getsource(MPClient.start_engine_core_monitor)
    assert "engine_dead = True" in monitor  # the flag engine_core_alive reads
    assert "utility_results" not in monitor and "outputs_queue" not in monitor, (
        "vLLM's engine-core monitor now touches the pending waits: the watchdog in vllm_compat may go")
    assert "future.result()" in inspect.getsource(SyncMPClient.call_utility), (
        "SyncMPClient.call_utility no longer waits without a timeout: the watchdog in vllm_compat may go")


def _sleeper() -> None:
    import time

    time.sleep(600)


def _client(proc) -> SimpleNamespace:
    """The attributes of vllm.LLM the watchdog reads: the engine-core processes, the client's dead flag,
    its pending utility futures and output queue."""
    core = SimpleNamespace(resources=SimpleNamespace(engine_dead=False, engine_manager=SimpleNamespace(processes=[proc])),
                           utility_results={}, outputs_queue=Queue())
    return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=core))


def test_a_call_whose_engine_core_dies_fails_instead_of_hanging():
    proc = mp.get_context("spawn").Process(target=_sleeper, daemon=True)
    proc.start()
    llm = _client(proc)
    pending: Future = Future()  # what SyncMPClient.call_utility waits on, with no timeout
    llm.llm_engine.engine_core.utility_results[1] = pending
    assert engine_core_alive(llm)
    assert watched_call(llm, "fast", lambda x: x + 1, 41) == 42  # a call that returns is passed through
    with pytest.raises(ValueError, match="own error"):
        watched_call(llm, "raising", lambda: (_ for _ in ()).throw(ValueError("own error")))

    out: dict = {}

    def call() -> None:
        try:
            watched_call(llm, "fp8rl_load", pending.result)
        except EngineCoreDied as e:
            out["error"] = e

    t = threading.Thread(target=call, daemon=True)
    t.start()
    proc.kill()
    t.join(120)  # a liveness guard (the call would otherwise block forever), not a timing assert
    assert not t.is_alive() and str(out["error"]) == "fp8rl_load"
    assert not engine_core_alive(llm)
    assert pending.done() and isinstance(pending.exception(), EngineCoreDied)  # the pending wait was resolved
    assert isinstance(llm.llm_engine.engine_core.outputs_queue.get_nowait(), EngineCoreDied)
    assert not engine_core_alive(None)


def test_model_classes_here_lets_vllm_inspect_the_class_without_a_subprocess(tmp_path, monkeypatch):
    """With an empty modelinfo cache (a fresh machine) vLLM inspects a lazily registered class in a Python
    process of its own; after ``model_classes_here`` it answers from the imported class, with the interfaces
    that inspection reports, and starts no process. When the first assertion fails, vLLM no longer inspects
    in a subprocess: ``model_classes_here`` may go."""
    import subprocess

    from vllm import ModelRegistry
    from vllm.model_executor.models import registry

    from fp8rl_core.sampler.vllm.compat import model_classes_here

    arch = "Qwen3MoeForCausalLM"
    # the entry a fresh process has (an engine started earlier in this process may have registered the class)
    module, cls = registry._VLLM_MODELS[arch]
    lazy = registry._LazyRegisteredModel(module_name=registry._resolve_module_name(module), class_name=cls)
    monkeypatch.setitem(ModelRegistry.models, arch, lazy)  # put back after the test
    assert "_run_in_subprocess" in inspect.getsource(type(lazy).inspect_model_cls), (
        "vLLM no longer inspects a lazily registered class in a subprocess: model_classes_here may go")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))  # no modelinfo cached

    run = subprocess.run

    def refused(cmd, *args, **kwargs):  # vLLM's inspection: python -m vllm.model_executor.models.registry
        if any("vllm" in str(part) for part in (cmd if isinstance(cmd, (list, tuple)) else [cmd])):
            raise AssertionError(f"a subprocess was started: {cmd}")
        return run(cmd, *args, **kwargs)  # others (platform's `file -b python`) are not vLLM's inspection

    monkeypatch.setattr(subprocess, "run", refused)
    model_classes_here([arch, "NoSuchArchitecture"])
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

    assert ModelRegistry.models[arch].load_model_cls() is Qwen3MoeForCausalLM
    info = ModelRegistry.models[arch].inspect_model_cls()
    assert info == registry._ModelInfo.from_model_cls(Qwen3MoeForCausalLM)
    assert info.architecture == arch and info.supports_pp and not info.supports_multimodal
    assert not list(tmp_path.iterdir())


def test_the_functions_vllm_compiles_on_the_cpu_run_as_plain_python_and_give_the_same_integers():
    """``eager_on_cpu``: each function of ``EAGER_ON_CPU`` is still compiled by the installed vLLM (else the
    workaround is moot: drop its row) and, once replaced, is the function ``torch.compile`` wrapped — in its
    module and where it was imported by name — and computes what its rule says: a token's rank among a row's
    log-probs (how many are ≥ its own), the embedding's in-shard mask and offsets."""
    import importlib

    import torch

    from fp8rl_core.sampler.vllm.compat import EAGER_ON_CPU, eager_on_cpu

    for module, name, _ in EAGER_ON_CPU:
        source = inspect.getsource(importlib.import_module(module))
        head = source[: source.index(f"def {name}(")].rstrip().splitlines()[-1]
        assert head.startswith("@torch.compile("), (module, name, head)
    eager_on_cpu()
    assert eager_on_cpu() == []  # idempotent: nothing left to replace
    for module, name, importers in EAGER_ON_CPU:
        fn = getattr(importlib.import_module(module), name)
        assert not hasattr(fn, "_torchdynamo_orig_callable") and inspect.isfunction(fn), (module, name)
        assert all(getattr(importlib.import_module(m), name) is fn for m in importers), (name, importers)

    from vllm.model_executor.layers.vocab_parallel_embedding import get_masked_input_and_mask
    from vllm.v1.sample.ops.logprobs import batched_count_greater_than

    g = torch.Generator().manual_seed(0)
    logprobs = torch.randn(6, 1000, generator=g).log_softmax(-1)
    token = torch.randint(0, 1000, (6, 1), generator=g)
    mine = logprobs.gather(-1, token)
    ranks = batched_count_greater_than(logprobs, mine)
    by_sorting = [int((logprobs[i].sort(descending=True).values >= mine[i]).sum()) for i in range(6)]
    assert ranks.tolist() == by_sorting and all(r >= 1 for r in by_sorting)
    ids = torch.tensor([0, 5, 511, 512, 700, 1023, 1030, 1040])
    # the second of two shards: ids 512..1023 at rows 0..511, added ids 1032..1047 after them (rows 520..)
    masked, mask = get_masked_input_and_mask(ids, 512, 1024, 0, 1032, 1048)
    assert mask.tolist() == [True, True, True, False, False, False, True, False]  # True: not this shard's
    assert masked.tolist() == [0, 0, 0, 0, 188, 511, 0, 520]
