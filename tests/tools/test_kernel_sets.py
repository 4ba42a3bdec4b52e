"""tools/kernel_sets.py on real warm starts: two variants trained in fresh processes, two steps each — the other
kernel set (AVX2 where torch picks AVX-512) differs from the first optimizer step on (measured over 60 steps and
two thread counts: docs/results/README.md, Do the numbers travel?; that one kernel set trains deterministically:
tests/core/learner/test_warmstart.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import kernel_sets  # noqa: E402

CONFIG = str(ROOT / "configs" / "verl-smoke.yaml")


def test_first_difference_names_the_first_differing_step():
    ref = [[0, "a"], [1, "b"], ["end", "c"]]
    assert kernel_sets.first_difference(ref, ref) == "none"
    assert kernel_sets.first_difference([[0, "a"], [1, "x"], ["end", "y"]], ref) == "1"
    assert kernel_sets.first_difference([[0, "a"], [1, "b"], ["end", "y"]], ref) == "end"


def test_a_warm_start_moves_from_its_first_step_on_another_kernel_set(capsys):
    kernel_sets.main([CONFIG, "--steps", "2", "--variants", "default/1,avx2/1", "--at", "0,1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["default/1", "avx2/1"], lines
    assert lines[0].endswith("first step differing from default/1: none"), lines  # the reference itself
    if torch.backends.cpu.get_cpu_capability() == "AVX2":
        pytest.skip("torch's default kernel set here is AVX2 itself")
    # the initial weights equal (step 0), the first AdamW step's result not
    assert "capability AVX2" in lines[1] and lines[1].endswith("first step differing from default/1: 1"), lines
