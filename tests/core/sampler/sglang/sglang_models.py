"""Builds SGLang's own Qwen3 / Qwen3-MoE on MXFP8 on CPU and loads fp8rl's export through fp8rl's SGLang
loader; run by tests/core/sampler/sglang/test_models.py inside .venv-sglang (``make setup-sglang``).

Prints one JSON line per model (what SGLang created, what was sent, what differs, what failed); the test
asserts on it.
"""

from __future__ import annotations

import json
import os
import sys

import torch

# SGLang's CPU platform (docs/platforms/cpu_server.md in its repository): without it SGLang takes this host for
# an unknown accelerator and its rotary embedding imports vLLM's CUDA ops
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"

# torchvision from PyPI links libtorch_cuda, so its C ops never load beside the CPU torch, and its
# _meta_registrations then fails on the two ops it registers unguarded; defining their schemas lets the
# pure-Python torchvision import (SGLang imports it on every path: sglang.srt.utils.common, transformers'
# image processors). No torchvision op is ever called here.
for op in ("nms", "qnms"):
    torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 4))  # the repository
sys.path.insert(0, ROOT)  # fp8rl itself is not installed in .venv-sglang: its source tree is imported

import sglang  # noqa: E402
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.layers.dp_attention import initialize_dp_attention  # noqa: E402
from sglang.srt.layers.moe import initialize_moe_config  # noqa: E402
from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod, Fp8MoEMethod  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402
from sglang.srt.models.qwen3 import Qwen3ForCausalLM  # noqa: E402
from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM  # noqa: E402

from fp8rl_core.learner.config import LearnerConfig  # noqa: E402
from fp8rl_core.learner.learner import Learner  # noqa: E402
from fp8rl_core.learner.models import build_model  # noqa: E402
from fp8rl_core.learner.patterns import gemm_layers  # noqa: E402
from fp8rl_core.learner.spec import load_model_spec  # noqa: E402
from fp8rl_core.sampler.presets import sampler_schemes  # noqa: E402
from fp8rl_core.sync.export import export_weights  # noqa: E402
from fp8rl_core.sync.layout import ModelLayout  # noqa: E402
from fp8rl_core.sync.ranks import slice_for_rank  # noqa: E402
from fp8rl_core.sampler.sglang.loader import DERIVED, SglangLoadError, load_into, load_weights, sglang_name  # noqa: E402

QUANT = {"quant_method": "mxfp8", "activation_scheme": "dynamic"}


def sglang_model(spec, workdir, tp):
    """SGLang's model class for the spec, built as SGLang's loader builds it (default dtype BF16, the
    checkpoint's MXFP8 quantization config)."""
    cfg = spec.hf_config()
    cls = Qwen3MoeForCausalLM if spec.kind == "moe" else Qwen3ForCausalLM
    cfg.quantization_config, cfg.architectures = dict(QUANT), [cls.__name__]
    cfg.save_pretrained(workdir)
    args = ServerArgs(model_path=workdir, device="cpu", skip_tokenizer_init=True, tp_size=tp)
    set_global_server_args_for_scheduler(args)
    initialize_dp_attention(server_args=args, model_config=ModelConfig.from_server_args(args))
    initialize_moe_config(args)
    torch.set_default_dtype(torch.bfloat16)
    try:
        return cls(cfg, quant_config=Fp8Config.from_config(QUANT))
    finally:
        torch.set_default_dtype(torch.float32)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8)


def _counting(model):
    """Wrap every quantized layer's own ``process_weights_after_loading`` so that its calls are counted and
    what SGLang's method raised on this CPU is recorded (the method itself still runs)."""
    calls: dict[str, list[str]] = {}
    for name, m in model.named_modules():
        method = getattr(m, "quant_method", None)
        if not isinstance(method, (Fp8LinearMethod, Fp8MoEMethod)):
            continue
        calls[name] = []

        def run(layer, real=method.process_weights_after_loading, name=name):
            try:
                real(layer)
                calls[name].append("ok")
            except (AssertionError, RuntimeError) as e:
                calls[name].append(f"{type(e).__name__}: {e}")

        method.process_weights_after_loading = run
    return calls


def check(spec_name: str, rank: int, tp: int) -> dict:
    import tempfile

    spec = load_model_spec(os.path.join(ROOT, "configs", "models", spec_name + ".yaml"))
    with tempfile.TemporaryDirectory() as d:
        model = sglang_model(spec, d, tp)
    learner = Learner(build_model(spec, 0), LearnerConfig(precision="mxfp8", layers="all"))
    whole = export_weights(learner.model, learner.forward_weights(),
                           sampler_schemes(gemm_layers(learner.model), "all"))
    # this rank's shard as fp8rl cuts it (vLLM's rules): what SGLang's parallel layers must hold
    full = slice_for_rank(whole, ModelLayout.from_hf_config(spec.hf_config()), rank, tp).tensors
    params = dict(model.named_parameters())
    created = {n for n in params if not any(d in n for d in DERIVED)}
    sent = {sglang_name(n): n for n in full}
    out = {"model": spec_name, "tp": tp, "rank": rank, "sglang": sglang.__version__, "parameters": len(created), "sent": len(sent),
           "not_sent": sorted(created - set(sent)), "unknown_to_sglang": sorted(set(sent) - created),
           "shape_or_dtype": sorted(f"{n}: sglang {list(params[n].shape)} {params[n].dtype}, sync "
                                    f"{list(full[f].shape)} {full[f].dtype}" for n, f in sent.items()
                                    if n in params and (params[n].shape != full[f].shape
                                                        or params[n].element_size() != full[f].element_size()))}
    out["methods"] = sorted({type(m.quant_method).__name__ for m in model.modules()
                             if getattr(m, "quant_method", None) is not None})

    calls = _counting(model)
    # a bad sync fails naming the tensor, and nothing is written
    snapshot = {n: _bytes(p).clone() for n, p in params.items()}
    o = "model.layers.1.self_attn.o_proj.weight"
    bad = {
        "unknown": list(full.items()) + [("model.layers.0.self_attn.qkv_proj.weight_scal", torch.zeros(1))],
        "extra": list(full.items()) + [("model.layers.9.mlp.down_proj.weight", full[o])],
        "missing": [(n, t) for n, t in full.items() if n != "lm_head.weight"],
        "shape": [(n, t[:, : t.shape[1] // 2] if n == o else t) for n, t in full.items()],
    }
    out["errors"] = {}
    for case, tensors in bad.items():
        try:
            load_into(model, tensors, complete=True)
            out["errors"][case] = None
        except SglangLoadError as e:
            out["errors"][case] = str(e)
    out["untouched_after_errors"] = all(torch.equal(_bytes(p), snapshot[n]) for n, p in params.items())

    # the whole sync through SGLang's custom-loader entry point, in place
    before = {n: (id(p), p.data_ptr()) for n, p in params.items()}
    load_weights(model, list(whole.items()))  # full tensors: the loader cuts them for SGLang's rank
    after = dict(model.named_parameters())
    out["identity_kept"] = {n: (id(p), p.data_ptr()) for n, p in after.items() if n in before} == before
    out["differs"] = sorted(n for n, f in sent.items() if n in after
                            and not torch.equal(_bytes(after[n]), _bytes(full[f])))
    out["process_calls"] = {n: c for n, c in calls.items()}
    return out


def main():
    """``sglang_models.py MODEL[,MODEL...] [TP RANK PORT]``: one TP rank (a process per rank, gloo over
    loopback), a JSON line per model."""
    if sys.argv[1] == "--import-only":
        print("sglang", sglang.__version__, "imports on torch", torch.__version__)
        return
    models, tp, rank, port = sys.argv[1], *(int(a) for a in (sys.argv[2:] or ["1", "0", "29533"]))
    init_distributed_environment(world_size=tp, rank=rank, local_rank=rank, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    initialize_model_parallel(tp)
    for model in models.split(","):
        print(json.dumps(check(model, rank, tp)), flush=True)


if __name__ == "__main__":
    main()
