"""SGLang behind the sampler seam: fp8rl's custom weight loader for SGLang's ``update_weights_from_tensor``
(:mod:`.loader`, what verl's SGLang rollout is given), the SGLang engine (:mod:`.engine`: SGLang's HTTP server in
its own venv, driven over HTTP), fp8rl's per-rank operations inside SGLang's schedulers (:mod:`.worker`) and every
workaround to SGLang's internals with the server's entry point (:mod:`.compat`). SGLang is imported only inside
an SGLang process.
"""
