"""How ``make test``'s xdist workers compute (tests/conftest.py): in a worker, torch runs one OpenMP thread
whose idle threads sleep, and every process a test starts inherits that."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import WORKER_OPENMP


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="outside an xdist worker (make test runs two)")
def test_a_worker_and_the_processes_it_starts_compute_with_one_passive_openmp_thread():
    import torch

    assert torch.get_num_threads() == 1 and all(os.environ[k] == v for k, v in WORKER_OPENMP.items())
    out = subprocess.run([sys.executable, "-c", "import torch, os; print(torch.get_num_threads(), os.environ['OMP_WAIT_POLICY'])"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "PASSIVE"], out.stderr[-2000:]
