import sys, enum
from fp8rl_core.loop import start_pipeline, sync_weights
from fp8rl_core.sampler.config import SamplerConfig
ck = sys.argv[1]
pipe = start_pipeline(ck, "all", sampler_cfg=SamplerConfig(dtype="float32", max_model_len=64, max_num_seqs=8, kv_cache_gib=0.0625, process="in-process"))
s = pipe.sampler
def plain(model):
    out = {}
    for prefix, m in model.named_modules():
        for k, v in vars(m).items():
            if k.startswith("_"):
                continue
            if isinstance(v, (bool, int, float, str, type(None), enum.Enum)) or (isinstance(v, (tuple, list)) and len(v) <= 16 and all(isinstance(x, (bool, int, float, str)) for x in v)):
                out[f"{prefix}.{k}"] = repr(v)
    return out
a = s.llm.apply_model(plain)[0]
s.generate(__import__("torch").tensor([[1,2,3]]), 2, 4, seed=0, eos_id=[2], pad_id=0)
pipe.learner.version += 1
sync_weights(pipe)
b = s.llm.apply_model(plain)[0]
print(len(a), len(b))
for k in sorted(set(a)|set(b)):
    if a.get(k) != b.get(k): print("CHANGED", k, a.get(k), b.get(k))
