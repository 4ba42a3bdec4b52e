"""SGLang behind the sampler seam: fp8rl's custom weight loader for SGLang's ``update_weights_from_tensor``
(:mod:`.loader`, what verl's SGLang rollout is given). SGLang is imported only inside an SGLang process.
"""
