"""The learner: tiny Qwen3 dense / MoE policies, a Transformer-Engine-faithful MXFP8 training
emulation on CPU, a verifiable synthetic task with a supervised warm start, and the GRPO step.

Modules: ``config`` (the learner's configs and their defaults: Recipe, GRPOConfig, LearnerConfig,
WarmStartConfig), ``recipe`` (Recipe alone, no pydantic: what ``mxfp8`` imports), ``spec`` (model specs),
``models`` (model builders), ``task`` (synthetic addition task, rewards),
``dataset`` (a user's RL dataset as a task: verl's prompts, left-padded batches, a verl-signature scorer),
``warmstart`` (supervised warm start, content-addressed checkpoints), ``patterns`` (which layers are on
the grid), ``mxfp8`` (the MXFP8 linear / experts emulation, module swap, the learner's FP8 forward
weights), ``grpo`` (micro-batched GRPO step), ``timers`` (per-micro-batch timing).
"""
