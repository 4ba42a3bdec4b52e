import sys
from fp8rl_core.loop import start_pipeline, sync_weights
from fp8rl_core.checks import CheckRunner, CheckPolicy
from fp8rl_core.sampler.config import SamplerConfig
for ck in sys.argv[1:]:
    pipe = start_pipeline(ck, "all", sampler_cfg=SamplerConfig(dtype="float32", max_model_len=64, max_num_seqs=8, kv_cache_gib=0.0625, process="in-process"))
    r = CheckRunner(CheckPolicy())
    r.start(pipe.samplers)
    pipe.learner.version += 1
    sync_weights(pipe)
    rep = r.check(pipe)
    for x in rep.results_by["W6"].detail.split(" | "): print(x)
    print(rep.failed, rep.message()[:500])
    pipe.sampler.close()
