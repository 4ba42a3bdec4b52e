"""verl's SGLang rollout on CPU as far as it runs (fp8rl run refuses the whole: fp8rl_core.verl.preflight): verl
0.9.1's own ``SGLangHttpServer`` launched with the rollout config fp8rl generates for ``verl.rollout: sglang`` on
``verl.hardware: cpu``, in .venv-sglang's interpreter with verl's venv after it (tests/verl/sglang_server.py),
generates through verl's ``generate``; then verl's sync call into SGLang on a CPU tensor stops in SGLang's
serializer. An engine test (the ``checkpoints`` fixture); skipped without .venv-sglang. docs/gpu.md, verl on CPU."""

from __future__ import annotations

import json
import linecache
import math
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

from fp8rl_core.config.runs import Sweep
from fp8rl_core.verl import verl_overrides
from fp8rl_core.verl.compose import check
from fp8rl_core.verl.data import write_model_dir

from ..core.sampler.conftest import SPECS, checkpoints  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-sglang" / "bin" / "python"

pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason=(
    f"{PYTHON.relative_to(ROOT)} is absent: `make setup-sglang` builds the SGLang venv (`make test` builds it)"))


def test_verls_sglang_server_starts_on_cpu_from_fp8rls_config_and_generates_with_verls_dummy_weights(
        checkpoints, tmp_path):  # noqa: F811
    model = write_model_dir(checkpoints["dense"], tmp_path / "model", SPECS["dense"].vocab_size)
    run = Sweep.load("configs/verl-smoke.yaml", ["axes.model=[qwen3-dense-mini]", "axes.preset=[bf16-sampler]",
                                                 "verl.rollout=sglang"]).runs[0]
    cfg, _ = check(run, verl_overrides(run, data_dir=tmp_path, model_path=model))
    OmegaConf.save(cfg.actor_rollout_ref.rollout, tmp_path / "rollout.yaml", resolve=True)
    OmegaConf.save(cfg.actor_rollout_ref.model, tmp_path / "model.yaml", resolve=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "SGLANG_USE_CPU_ENGINE": "1"}
    rc, stdout, stderr = _run_alone([str(PYTHON), str(Path(__file__).with_name("sglang_server.py")),
                                     sysconfig.get_paths()["purelib"], str(tmp_path / "rollout.yaml"),
                                     str(tmp_path / "model.yaml")], cwd=tmp_path, env=env, timeout=400)
    assert rc == 0, stdout[-2000:] + stderr[-3000:]
    res = json.loads(stdout.strip().splitlines()[-1])
    assert res["transformers"] == "5.6.0"  # .venv-sglang's, ahead of verl's venv's 5.19
    assert res["server_args"] == {"device": "cpu", "attention_backend": "torch_native", "load_format": "dummy",
                                  "enable_memory_saver": False}
    # four tokens drawn uniformly (the dummy weights, below), or fewer where one drawn is the model's EOS (1 in 1024
    # a token: seen once, the first token 2)
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    ids = res["token_ids"]
    assert (len(ids), res["stop_reason"]) == (4, "length") or (1 <= len(ids) <= 4 and ids[-1] == eos
                                                                and eos not in ids[:-1]), res
    assert all(0 <= t < SPECS["dense"].vocab_size for t in res["token_ids"])
    # verl's hybrid rollout starts on dummy weights (its first sync brings the learner's: the stop below):
    # near-zero logits, every sampled token at -ln(vocabulary)
    for lp in res["log_probs"]:
        assert lp == pytest.approx(-math.log(SPECS["dense"].vocab_size), abs=1e-3)
    # what verl's SGLang adapter calls at every sync (sglang_rollout.py:380: SGLang's ``update_weights`` on the
    # rollout mesh), on a CPU tensor: IndexError in SGLang's patched tensor reduction, before any request is sent
    # (``engine=None`` is never reached) — where fp8rl_core.verl.preflight.SGLANG_CPU_STOP says verl's CPU sync stops
    src = Path(verl.__file__).parent / "workers/rollout/sglang_rollout/sglang_rollout.py"
    assert "await sgl_update_weights(" in linecache.getline(str(src), 380)
    kind, msg, frames = res["sync_stop"]
    assert (kind, msg) == ("IndexError", "tuple index out of range")
    assert any(f.endswith("sglang/srt/weight_sync/utils.py:47") for f in frames)
    assert any(f.endswith("sglang/srt/utils/patch_torch.py:103") for f in frames)
    print(f"verl's SGLang server started in {res['start_s']:.1f} s", file=sys.stderr)


def _run_alone(cmd: list[str], cwd: Path, env: dict, timeout: float) -> tuple[int | None, str, str]:
    """Run ``cmd`` in a session of its own with its output in files, wait for it alone, then stop what it left.

    SGLang's scheduler inherits the script's stdout and stderr and ends only when its parent watch notices the
    script is gone: waiting for the pipes' end (``subprocess.run(capture_output=True)``) waited for the scheduler
    too, and once past the script's exit (CI, 2026-12-05: the result printed, exit 0, 400 s of waiting)."""
    out, err = cwd / "server.stdout", cwd / "server.stderr"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, cwd=cwd, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the script (on a timeout) and SGLang's scheduler, if still there
        except ProcessLookupError:
            pass
        proc.wait()
    return rc, out.read_text(), err.read_text() + ("" if rc is not None else f"\n(no exit after {timeout} s)")
