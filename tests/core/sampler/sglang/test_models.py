"""fp8rl's SGLang loader against SGLang's own code: SGLang 0.5.12's ``Qwen3ForCausalLM`` /
``Qwen3MoeForCausalLM`` with its MXFP8 ``Fp8LinearMethod`` / ``Fp8MoEMethod``, built on CPU in .venv-sglang
(``make setup-sglang``) by tests/core/sampler/sglang/sglang_models.py, one process per TP rank: every parameter SGLang's
methods create is sent under its name and shape, the loader writes fp8rl's export into them in place and they
read back byte for byte, a bad sync fails naming the tensor, and each quantized layer's own
``process_weights_after_loading`` is called once (on this CPU it stops at SGLang's AMX assertion).
Skipped, saying why, where .venv-sglang is absent. What is and is not verified: docs/gpu.md, SGLang.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
SCRIPT = Path(__file__).with_name("sglang_models.py")

pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason=(
    f"{PYTHON.relative_to(ROOT)} is absent: `make setup-sglang` builds the SGLang venv this test runs SGLang's "
    "own model classes in (`make test` builds it)"))


def _pinned() -> str:
    """The SGLang version constraints-sglang.txt pins (verl 0.9.1's, the version the loader is written against)."""
    text = (ROOT / "constraints-sglang.txt").read_text()
    return re.search(r"^sglang==(\S+)$", text, re.M).group(1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MODELS = ("qwen3-dense-mini", "qwen3-moe-mini")


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def ranks(request) -> tuple[int, dict[str, list[dict]]]:
    """Both models on every rank of one TP size (a process per rank): model → one result per rank."""
    tp, port = request.param, _port()
    procs = [subprocess.Popen([str(PYTHON), str(SCRIPT), ",".join(MODELS), str(tp), str(rank), str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(tp)]
    out: dict[str, list[dict]] = {m: [] for m in MODELS}
    for rank, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=600)
        finally:
            p.kill()
        assert p.returncode == 0, f"tp rank {rank}/{tp} failed:\n{stderr[-4000:]}"
        for line in stdout.strip().splitlines()[-len(MODELS):]:
            r = json.loads(line)
            out[r["model"]].append(r)
    return tp, out


@pytest.mark.parametrize("model", MODELS)
def test_the_loader_fills_sglangs_own_mxfp8_parameters(ranks, model):
    tp, results = ranks
    assert len(results[model]) == tp
    for rank, r in enumerate(results[model]):
        where = f"{model} tp rank {rank}/{tp}"
        assert r["sglang"] == _pinned(), f"installed SGLang {r['sglang']}, constraints-sglang.txt pins {_pinned()}"
        assert (r["tp"], r["rank"]) == (tp, rank)
        # the installed SGLang's parameter names, shapes and value classes are what the loader writes
        assert r["not_sent"] == [], f"{where}: SGLang creates parameters the sync does not send: {r['not_sent']}"
        assert r["unknown_to_sglang"] == [], f"{where}: the sync sends names SGLang lacks: {r['unknown_to_sglang']}"
        assert r["shape_or_dtype"] == [], f"{where}: {r['shape_or_dtype']}"
        assert r["parameters"] == r["sent"] == (29 if "moe" in model else 27)
        want = {"Fp8LinearMethod", "UnquantizedEmbeddingMethod"} | (
            {"Fp8MoEMethod", "UnquantizedLinearMethod"} if "moe" in model else set())
        assert set(r["methods"]) == want
        # in place, byte for byte
        assert r["identity_kept"] and r["differs"] == [], f"{where}: differs after the load: {r['differs']}"
        # each quantized layer's own method ran once, after its data and scales arrived
        layers = 2 * (3 if "moe" in model else 4)
        assert len(r["process_calls"]) == layers
        for name, calls in r["process_calls"].items():
            method = "Fp8MoEMethod" if name.endswith("experts") else "Fp8LinearMethod"
            assert calls == [f"AssertionError: {method} on CPU requires that CPU has AMX support"], name
        # a bad sync names the tensor and writes nothing
        o = "model.layers.1.self_attn.o_proj.weight"
        k = 128 // tp
        assert r["errors"] == {
            "unknown": "model.layers.0.self_attn.qkv_proj.weight_scal: SGLang's model has no parameter "
                       "'model.layers.0.self_attn.qkv_proj.weight_scal'; that layer has "
                       "['model.layers.0.self_attn.qkv_proj.weight', "
                       "'model.layers.0.self_attn.qkv_proj.weight_scale_inv']",
            "extra": "model.layers.9.mlp.down_proj.weight: SGLang's model has no parameter "
                     "'model.layers.9.mlp.down_proj.weight'",
            "missing": "the sync lacks 1 of SGLang's parameters, e.g. ['lm_head.weight']",
            "shape": f"{o}: SGLang's parameter is [128, {k}], the sync sends [128, {k // 2}]",
        }
        assert r["untouched_after_errors"]
