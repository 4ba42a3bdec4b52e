"""What the config tests share: the shipped configs' folders, a sweep file written into a test's folder,
the run configs of a sweep file and their ids."""

from __future__ import annotations

from pathlib import Path

from fp8rl_core.config.runs import Sweep, run_id
from fp8rl_core.config.schema import RunConfig

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"
MODELS = CONFIGS / "models"
SMOKE = CONFIGS / "smoke.yaml"

#: a valid run on the dense mini (``MODELS`` is replaced by the shipped models' folder)
GOOD_BASE = """
  models_dir: MODELS
  model: qwen3-dense-mini
  warmstart: {steps: 300, warmup: 30, task: {digits: 2}}
  sampler: {max_model_len: 64}
"""
#: a fixed-weights sweep's base on the dense tiny, two seeds (:func:`write_beside_models`)
FIXED_BASE = "sweep: fw\nbase: {model: qwen3-dense-tiny, warmstart: {steps: 100, task: {digits: 2}}}\naxes: {seed: [0, 1]}\n"


def write(tmp_path: Path, body: str, name: str = "sweep.yaml") -> Path:
    """``body`` as ``tmp_path/name``, ``MODELS`` in it replaced by the shipped models' folder."""
    path = tmp_path / name
    path.write_text(body.replace("MODELS", str(MODELS)))
    return path


def write_beside_models(tmp_path: Path, body: str) -> Path:
    """``body`` as ``tmp_path/fw.yaml`` with the shipped models linked as its ``models/`` folder."""
    path = tmp_path / "fw.yaml"
    path.write_text(body)
    (tmp_path / "models").symlink_to(MODELS)
    return path


def configs(path, overrides=()) -> list[RunConfig]:
    """The run configs of a sweep file, in its order."""
    return [r.config for r in Sweep.load(path, overrides).runs]


def run_ids(runs: list[RunConfig]) -> list[str]:
    return [run_id(r) for r in runs]
