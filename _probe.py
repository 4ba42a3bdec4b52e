import torch
from fp8rl_core.config.runs import Sweep
from fp8rl_core.loop import start_pipeline, RLStep
from fp8rl_core.checks import CheckRunner
from fp8rl_core.learner.warmstart import warm_start
from pathlib import Path
sw = Sweep.load("configs/clean-long.yaml", ["axes.model=[qwen3-dense-mini]", "axes.preset=[half]", "axes.seed=[1]"])
run = sw.runs[0]
cfg = run.config
ck = warm_start(run.spec, cfg.warmstart, Path(".cache/warmstart").resolve()).path
pipe = start_pipeline(ck, cfg.preset, learner=cfg.learner_config(), sampler_cfg=cfg.sampler, emittable=cfg.emittable())
probe = cfg.check_probe()
task = cfg.warmstart.task
for i in range(1, 41):
    rl = RLStep(pipe, task, i, prompts_per_step=cfg.loop.prompts_per_step, seed=cfg.seed)
    rl.learn(); rl.sync()
    if i % 10 == 0 or i >= 38:
        sl = pipe.sampler.prompt_logprobs(probe).float()
        ll = pipe.learner.probe_logprobs(probe).float()
        d = (sl - ll).abs()
        top = d.flatten().topk(5)
        print(i, "mean", float(d.mean()), "max", float(d.max()))
        for v, j in zip(top.values.tolist(), top.indices.tolist()):
            r, c = divmod(j, d.shape[-1])
            print("   ", round(v, 3), "learner logp", round(float(ll[r, c]), 3), "sampler logp", round(float(sl[r, c]), 3))
        # mean over positions where max(p) >= 1e-3
        keep = torch.maximum(sl, ll) >= -6.907755
        print("   kept", int(keep.sum()), "of", keep.numel(), "max kept", float(d[keep].max()), "mean kept", float(d[keep].mean()))
