"""The guard against two verl runs on one TransferQueue controller (adapters/ray_guard.py): the names it looks
up are the ones the installed TransferQueue creates its controller under; on a real Ray cluster that holds
an actor of that name and namespace, a verl run pointed at the cluster refuses in one line naming it, before
anything of the run is written; on one without, the look-up passes."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from adapters.ray_guard import CONTROLLER, NAMESPACE, SharedControllerError, controller_on

ROOT = Path(__file__).resolve().parents[2]

#: a driver that starts a local Ray, holds an actor named ``sys.argv[1]`` in namespace ``sys.argv[2]`` (none
#: when empty) and prints the cluster's address (``address=…``); it lives until its stdin closes
HOLDER = """
import sys, ray
ray.init(include_dashboard=False, num_cpus=1, log_to_driver=False)

@ray.remote(num_cpus=0)
class Held:
    def ping(self):
        return 1

if sys.argv[1]:
    a = Held.options(name=sys.argv[1], namespace=sys.argv[2]).remote()
    ray.get(a.ping.remote())
print("address=" + ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""


def test_the_names_are_those_transfer_queue_creates_its_controller_under():
    source = (Path(find_spec("transfer_queue").origin).parent / "interface.py").read_text()
    assert re.search(rf'\.options\((\s*#[^\n]*)?\s*name="{CONTROLLER}",\s*namespace="{NAMESPACE}"', source)
    assert f'ray.get_actor("{CONTROLLER}", namespace="{NAMESPACE}")' in source


@pytest.fixture(scope="module")
def holders():
    """Two local Ray clusters in processes of their own: one holding a controller-named actor, one another actor."""
    procs = {}
    try:
        for key, args in (("controller", [CONTROLLER, NAMESPACE]), ("other", ["SomethingElse", "elsewhere"])):
            procs[key] = subprocess.Popen([sys.executable, "-c", HOLDER, *args], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True, cwd=ROOT)
        yield {k: next(x for x in p.stdout if x.startswith("address=")).strip().removeprefix("address=")
               for k, p in procs.items()}
    finally:
        for p in procs.values():
            p.stdin.close()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_a_verl_run_pointed_at_a_ray_holding_a_controller_refuses_in_one_line(holders, tmp_path, monkeypatch):
    from fp8rl_core.config.runs import Sweep
    from tasks.verl_run import run_verl

    address = holders["controller"]
    assert re.match(r"^[\d.]+:\d+$", address), address
    assert controller_on(address) and not controller_on(holders["other"])
    monkeypatch.setenv("FP8RL_VERL_WORK", str(tmp_path / "verl"))
    (run,) = Sweep.load(ROOT / "configs" / "verl-smoke.yaml", ["axes.model=[qwen3-dense-mini]", "axes.preset=[all]"]).runs
    with pytest.raises(SharedControllerError) as e:
        run_verl.fn(run, "verl-smoke", "no-mlflow-run", ray_address=address)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"the Ray cluster at {address} already holds a {CONTROLLER} "
                                                      f"(namespace {NAMESPACE}) of another verl run"), message
    assert not any((tmp_path / "verl").rglob("*.json"))  # refused before anything of the run was written
