"""The SGLang engine's start without SGLang: a stand-in interpreter plays the server's exits, so the start's own
rules run in the fast tier — a server whose port was taken before it could bind it (another process's port race:
"address already in use") is started once more on another port; any other exit during the start fails at once
with the server's log."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sampler.seam import SamplerDeadError
from fp8rl_core.sampler.sglang.engine import PORT_TAKEN, SglangSampler
from fp8rl_core.sync.export import export_weights

SPEC = ModelSpec(name="sglang-start-test", kind="dense", vocab_size=1024, hidden_size=128, intermediate_size=384,
                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=64)


def _server(tmp_path: Path, line: str) -> Path:
    """An executable standing in for the SGLang venv's interpreter: it logs its --port and ``line``, then exits 3."""
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\nwhile [ \"$1\" != --port ]; do shift; done\n"
                   f"echo \"port $2\" >> {tmp_path / 'ports'}\necho 'ERROR: {line}'\nexit 3\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.fixture()
def checkpoint(tmp_path):
    model = build_model(SPEC, 0)
    model.save_pretrained(tmp_path / "checkpoint")
    return tmp_path / "checkpoint", export_weights(model, {}, {})


@pytest.mark.parametrize(("line", "starts"), [
    (f"[Errno 98] error while attempting to bind on address 127.0.0.1:1: {PORT_TAKEN}", 2),
    ("ModuleNotFoundError: No module named sglang", 1)])
def test_a_start_that_lost_its_port_is_started_once_more_on_another_port(tmp_path, checkpoint, line, starts):
    path, initial = checkpoint
    with pytest.raises(SamplerDeadError, match=r"exited with code 3 during start") as e:
        SglangSampler(path, {}, initial, SamplerConfig(max_model_len=32, max_num_seqs=2), work_root=tmp_path / "work",
                      python=_server(tmp_path, line), timeout_s=60)
    assert line in str(e.value)  # the (last) server's log, in the error
    ports = (tmp_path / "ports").read_text().split()[1::2]
    assert len(ports) == starts and len(set(ports)) == starts, ports  # a new port for the second start
