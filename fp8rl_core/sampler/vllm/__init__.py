"""vLLM behind the sampler seam: the engine fp8rl starts (:mod:`.engine`: ``VllmSampler``, and ``VllmWorkers`` shared
with verl's vLLM server), fp8rl's ``fp8rl`` quantization method (:mod:`.plugin`, registered in every vLLM process
through the ``vllm.general_plugins`` entry point), the worker extension that runs fp8rl's per-rank operations
(:mod:`.worker`), every vLLM 0.32 workaround (:mod:`.compat`) and the known-harmless lines of vLLM's processes
(:mod:`.quiet`). vLLM is imported only where an engine runs (the plugin and worker inside vLLM's processes).
"""
