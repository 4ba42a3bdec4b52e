import sys
from fp8rl_core import correctness
from fp8rl_core.loop import start_pipeline
from fp8rl_core.checks import CheckRunner, CheckPolicy
from fp8rl_core.checks.faults import fault
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.learner.task import AdditionTask
ck = sys.argv[1]
pipe = start_pipeline(ck, "all", sampler_cfg=SamplerConfig(dtype="float32", max_model_len=64, max_num_seqs=8, kv_cache_gib=0.0625, process="in-process"))
r = CheckRunner(CheckPolicy(full_every=100))
r.start(pipe.samplers)
task = AdditionTask(digits=2)
for name in ("norm-eps-changed", "norm-eps-unlike-learner"):
    row = correctness.inject(pipe, r, task, fault(name), prompts_per_step=4, seed=0)
    print({k: row[k] for k in ("fault", "tier", "why", "caught_first", "declared_offenders", "repaired", "W6", "W7")})
