"""adapters.sweeps: the five dispatch strategies share one signature and one table chooses among them (the flows
compare no mode's name); what a strategy gives back (the rows, each as it ends where runs end one after another);
where a verl sweep's runs go without a work pool (:func:`adapters.sweeps.side_by_side`): on CPU, each on a Ray of
its own, as many at once as this machine's cores and memory fit the sweep's ``resources`` (at least one); with a
cluster address, or GPU runs, one at a time. No Ray, no MLflow store (stand-ins record what would be opened);
the strategies on a real Ray, pool and verl: tests/flows/."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
from contextlib import contextmanager
from pathlib import Path

import pytest

from adapters import cluster, sweeps
from adapters.sweeps import STRATEGIES, Context, Mode, mode_of, side_by_side, strategy_for
from adapters.tracking import RunRow
from fp8rl_core.config.runs import Sweep

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "verl-smoke.yaml")
NATIVE = str(ROOT / "configs" / "smoke.yaml")


def machine(cpus: float, memory_gb: float = 64.0) -> cluster.Node:
    return cluster.Node("this-machine", "127.0.0.1", cpus, 0.0, memory_gb)


@pytest.mark.parametrize("cpus, extra, expected", [
    (2, [], 1),  # verl-smoke asks 2 cores a run: this machine runs one at a time
    (16, [], 8),
    (16, ["resources.memory_gb=20"], 3),  # 64 GiB / 20
    (3, [], 1),
    (1, [], 1),  # too small for one: still one at a time
])
def test_cpu_runs_start_together_as_far_as_the_machine_fits_them(monkeypatch, cpus, extra, expected):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "this_machine", lambda: machine(cpus))
    assert side_by_side(Sweep.load(SMOKE, extra), None) == expected


def test_a_cluster_address_or_gpu_runs_go_one_at_a_time(monkeypatch):
    monkeypatch.setattr(cluster, "this_machine", lambda: machine(64))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert side_by_side(Sweep.load(SMOKE), "10.0.0.1:6379") == 1
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert side_by_side(Sweep.load(SMOKE), None) == 1
    monkeypatch.delenv("RAY_ADDRESS")
    assert side_by_side(Sweep.load(SMOKE, ["verl.hardware=hopper", "model_path=Qwen/Qwen3-8B"]), None) == 1


def test_this_machine_is_its_cores_and_memory():
    import os

    import psutil

    m = cluster.this_machine()
    assert m.cpus == os.cpu_count() and m.gpus == 0 and m.memory_gb == pytest.approx(psutil.virtual_memory().total / 2**30)


def test_every_mode_has_a_strategy_and_every_strategy_the_one_signature():
    assert set(STRATEGIES) == set(Mode) and len({id(s) for s in STRATEGIES.values()}) == len(Mode)
    for mode, strategy in STRATEGIES.items():
        assert list(inspect.signature(strategy).parameters) == ["sweep", "todo", "how"], mode
        assert list(inspect.signature(strategy.check).parameters) == ["sweep", "how"], mode
        assert list(inspect.signature(strategy.interrupted).parameters) == ["e"], mode
        assert strategy.what in ("runs", "verl runs"), mode


@pytest.mark.parametrize("config, extra, kw, cpus, mode", [
    (NATIVE, [], {}, 16, Mode.RAY),
    (NATIVE, [], {"ray_address": "10.0.0.1:6379"}, 16, Mode.RAY),
    (NATIVE, [], {"inline": True}, 16, Mode.INLINE),
    (SMOKE, [], {"work_pool": "fp8rl-b200"}, 16, Mode.POOL),
    (SMOKE, ["resources.work_pool=fp8rl-b200"], {}, 16, Mode.POOL),
    (SMOKE, [], {"inline": True}, 16, Mode.SIDE_BY_SIDE),  # inline is a native sweep's: verl never falls back
    (SMOKE, [], {}, 2, Mode.ONE_AFTER_ANOTHER),
    (SMOKE, [], {"ray_address": "10.0.0.1:6379"}, 16, Mode.ONE_AFTER_ANOTHER),
])
def test_the_table_chooses_the_strategy_of_the_sweeps_mode(monkeypatch, config, extra, kw, cpus, mode):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "this_machine", lambda: machine(cpus))
    sweep = Sweep.load(config, extra)
    assert mode_of(sweep, **kw) is mode and strategy_for(sweep, **kw) is STRATEGIES[mode]
    stand_ins = {m: object() for m in Mode}  # whatever the table holds is what the flow gets
    monkeypatch.setattr(sweeps, "STRATEGIES", stand_ins)
    assert strategy_for(sweep, **kw) is stand_ins[mode]


def test_a_sweep_mixing_backends_or_a_native_sweep_on_a_pool_is_refused_in_one_line():
    with pytest.raises(ValueError, match="a work pool .* dispatches backend verl runs"):
        mode_of(Sweep.load(NATIVE), work_pool="fp8rl-b200")
    native, verl = Sweep.load(NATIVE), Sweep.load(SMOKE)
    mixed = dataclasses.replace(native, runs=native.runs + verl.runs)
    with pytest.raises(ValueError, match="mixes native and verl"):
        mode_of(mixed)


def test_the_flow_compares_no_mode_and_hands_every_strategy_the_same_context():
    """flows/pipelines.py's sweep asks the table (``strategy_for``) and calls what it gets with one Context: no
    branch on ``inline``, ``work_pool``, ``ray_address`` or a mode there."""
    tree = ast.parse((ROOT / "flows" / "pipelines.py").read_text())
    (sweep_fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_sweep"]
    for node in ast.walk(sweep_fn):
        if isinstance(node, (ast.If, ast.IfExp, ast.Compare, ast.Match)):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            assert not names & {"inline", "work_pool", "ray_address", "Mode", "mode", "backend"}, ast.unparse(node)
    assert "strategy_for" in ast.unparse(sweep_fn) and "Mode" not in ast.unparse(sweep_fn)


def _context(run_one, opened: list) -> Context:
    @contextmanager
    def progress(sweep: str, total: int):
        yield lambda row: opened.append(("done", row.name))

    return Context(run_one, lambda: None, lambda: "parent", progress, "flow-run", ".cache/warmstart")


def _stand_ins(monkeypatch, opened: list) -> None:
    """MLflow left out: each run's record is its name; a failed run's line goes to a plain logger."""
    monkeypatch.setattr(sweeps, "open_run", lambda run, *a: opened.append(("open", run.name)) or f"m-{run.name}")
    monkeypatch.setattr(sweeps, "open_scheduled", lambda sweep, runs, parent, flow_run=None: [
        (r, opened.append(("open", r.name)) or f"m-{r.name}") for r in runs])
    monkeypatch.setattr(sweeps, "get_run_logger", lambda: logging.getLogger("fp8rl-test"))


def test_one_after_another_gives_each_row_as_its_run_ends_and_a_failure_does_not_stop_the_next(monkeypatch):
    opened: list = []
    _stand_ins(monkeypatch, opened)
    sweep = Sweep.load(SMOKE)
    first, second = sweep.runs[:2]

    def run_one(run, mlflow_run):
        opened.append(("run", run.name))
        if run is first:
            raise RuntimeError("verl's main_ppo exited with status 1")
        return RunRow(run.id, mlflow_run, run.name, "FINISHED")

    rows = STRATEGIES[Mode.ONE_AFTER_ANOTHER](sweep, [first, second], _context(run_one, opened))
    row = next(iter(rows))  # the first run's row before the second run starts (or is even opened)
    assert (row.name, row.status, row.mlflow_run) == (first.name, "FAILED: RuntimeError", f"m-{first.name}")
    assert opened == [("open", first.name), ("run", first.name)]
    assert [r.status for r in rows] == ["FINISHED"]


def test_inline_opens_every_record_first_then_runs_each_and_tells_its_progress(monkeypatch):
    opened: list = []
    _stand_ins(monkeypatch, opened)
    sweep = Sweep.load(NATIVE, ["axes.seed=[0]"])
    todo = sweep.runs[:2]

    def run_one(run, mlflow_run):
        opened.append(("run", run.name))
        return RunRow(run.id, mlflow_run, run.name, "FINISHED")

    rows = list(STRATEGIES[Mode.INLINE](sweep, todo, _context(run_one, opened)))
    assert [r.mlflow_run for r in rows] == [f"m-{r.name}" for r in todo]
    a, b = (r.name for r in todo)
    assert opened == [("open", a), ("open", b), ("run", a), ("done", a), ("run", b), ("done", b)]
