"""fp8rl on verl: one verl run per ``backend: verl`` experiment (docs/gpu.md).

verl is imported only in this package, and only inside functions: importing ``fp8rl_core.verl`` (or any
module under it) loads neither verl nor Ray, so the rest of fp8rl_core stays importable without them.

``overrides``  a run → the Hydra overrides of verl's ``ppo_trainer`` (pure, no verl import),
               each override carrying the fp8rl field that produced it.
``payload``    the one validated, versioned payload verl's processes read from fp8rl (the run's learner,
               sampler and checks sections, spec, rollout schemes, the hooks of its syncs): a file in the run's
               work folder named by one environment variable, ``FP8RL_VERL_PAYLOAD``.
``compose``    compose those overrides under the *installed* verl's own config directory and run verl's own
               validation; verl's errors come back naming the fp8rl fields behind the offending keys.
``data``       fp8rl's task as verl's parquet dataset (the native loop's prompts, in step order), and a
               tokenizer whose ids are the task's ids.
``reward``     verl's ``custom_reward_function``: fp8rl's own task reward on verl's decoded responses.
``platform``, ``engine``, ``patches``  verl's trainer on a CPU host: fp8rl's platform in verl's registry, verl's
               FSDP engine with fp8rl's MXFP8 layers for ``device="cpu"``, the one upstream patch.
``rollout``, ``extension``  fp8rl's rollout classes in verl's registries.
``checking``   W1–W7 after every sync of a replica; ``server_sampler`` the sampler seam on verl's vLLM server
               they check; ``verdicts`` the verdicts on a run's check reports (a planted fault caught, repaired).
``metrics``    a verl run's summary metrics from verl's per-step ones.
"""

from fp8rl_core.verl.overrides import Override, hydra_value, verl_overrides

__all__ = ["Override", "hydra_value", "verl_overrides"]
