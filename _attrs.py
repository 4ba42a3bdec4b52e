import sys, json, torch
from fp8rl_core.loop import start_pipeline
from fp8rl_core.sampler.config import SamplerConfig
ck = sys.argv[1]
pipe = start_pipeline(ck, "all", sampler_cfg=SamplerConfig(dtype="float32", max_model_len=64, max_num_seqs=8, kv_cache_gib=0.0625, process="in-process"))
s = pipe.sampler
# reach the in-process worker model
eng = s
print(type(s), [a for a in dir(s) if not a.startswith("__")][:80])
def plain(model):
    out = {}
    for prefix, m in model.named_modules():
        for k, v in vars(m).items():
            if k.startswith("_"):
                continue
            if isinstance(v, (bool, int, float, str, type(None))) or (isinstance(v, (tuple, list)) and len(v) <= 16 and all(isinstance(x, (bool, int, float, str)) for x in v)):
                out[f"{prefix}.{k}|{type(m).__name__}"] = v
    return out
a = s.llm.apply_model(plain)[0]
print(len(a))
for k, v in a.items():
    if "rotary" in k or ("layers.0.self_attn.attn" in k):
        print(k, repr(v)[:80])
