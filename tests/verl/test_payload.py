"""fp8rl_core.verl.payload: the one thing a verl run's processes receive from fp8rl — written once, read back
equal, refused in one line when of another schema version, with an unknown field or an invalid value; its
hooks plant a fault on its rank at its version and nothing else; the overrides' rollout quantization is the
payload's; nothing re-reads the model spec file."""

from __future__ import annotations

import json

import pytest

from fp8rl_core.config.runs import Sweep
from fp8rl_core.config.schema import RunConfig
from fp8rl_core.sync.hooks import NO_HOOKS
from fp8rl_core.verl.payload import (NO_VERL_HOOKS, PAYLOAD_ENV, PAYLOAD_VERSION, PayloadError, PlantedFault, VerlHooks,
                                     VerlPayload, payload)

SMOKE = "configs/verl-smoke.yaml"


@pytest.fixture(scope="module")
def run():
    return Sweep.load(SMOKE, ["axes.preset=[all]", "checks.full_every=3"]).runs[0]


def test_the_payload_carries_the_runs_own_sections_and_reads_back_equal(run, tmp_path):
    p = VerlPayload.of(run, tmp_path, VerlHooks(faults=(PlantedFault(name="post-load-twice", rank=1, version=3),)))
    cfg = run.config
    assert p.schema_version == PAYLOAD_VERSION and p.run_id == run.id and p.spec == run.spec
    assert p.learner == cfg.learner and p.sampler == cfg.sampler and p.checks == cfg.checks and p.preset == "all"
    assert p.learner_config() == cfg.learner_config() and p.check_policy() == cfg.check_policy()
    assert p.check_policy().full_every == 3
    assert [list(r) for r in p.probe] == cfg.check_probe().tolist() and p.reports == str(tmp_path / "checks.jsonl")
    assert set(p.rollout_schemes.values()) == {"mxfp8"} and p.mx_grid == "mxfp8-e4m3-rceil"
    path = p.write(tmp_path / "payload.json")
    assert VerlPayload.read(path) == p
    assert json.loads(path.read_text())["hooks"] == {"faults": [{"name": "post-load-twice", "rank": 1, "version": 3,
                                                                "checks_off": [], "on_failure": None,
                                                                "cheap_tier": False}]}


def test_another_schema_version_an_unknown_field_or_a_bad_value_is_refused_in_one_line(run, tmp_path):
    good = json.loads(VerlPayload.of(run, tmp_path).dumps())
    path = tmp_path / "payload.json"

    def refused(data) -> str:
        path.write_text(json.dumps(data))
        with pytest.raises(PayloadError) as e:
            VerlPayload.read(path)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"verl payload {path}: "), msg
        return msg

    assert "schema version 2, this fp8rl reads version 1" in refused(good | {"schema_version": 2})
    assert "schema version None" in refused({k: v for k, v in good.items() if k != "schema_version"})
    assert "learner.fp8: Extra inputs are not permitted" in refused(good | {"learner": good["learner"] | {"fp8": 1}})
    assert "workers: Extra inputs are not permitted" in refused(good | {"workers": 2})
    assert "checks.on_failure" in refused(good | {"checks": good["checks"] | {"on_failure": "ignore"}})
    assert "preset: " in refused(good | {"preset": "fp4"})
    path.write_text("{not json")
    with pytest.raises(PayloadError, match="cannot be read"):
        VerlPayload.read(path)
    with pytest.raises(PayloadError, match="cannot be read"):
        VerlPayload.read(tmp_path / "missing.json")


def test_a_process_reads_the_file_the_variable_names_once(run, tmp_path):
    assert payload({}) is None  # verl without fp8rl's launcher
    path = VerlPayload.of(run, tmp_path).write(tmp_path / "payload.json")
    first = payload({PAYLOAD_ENV: str(path)})
    path.write_text("{}")  # validated once per process: a later read is the first one's
    assert payload({PAYLOAD_ENV: str(path)}) is first and first.run_id == run.id


def test_a_planted_fault_acts_on_its_rank_at_its_version():
    from fp8rl_core.checks.faults import fault

    assert NO_VERL_HOOKS.at(0, 0) is NO_HOOKS and NO_VERL_HOOKS.at(1, 7).worker_hook() is None  # production
    plan = [PlantedFault(name="sampler-requantizes-floor", rank=1, version=1),
            PlantedFault(name="post-load-twice", version=3), PlantedFault(name="derived-copy-stale")]
    hooks = VerlHooks(faults=tuple(plan))
    floor, twice, stale = (fault(p.name) for p in plan)
    assert hooks.at(1, 1) is floor and hooks.at(0, 1) is stale  # rank 0: only the every-sync fault
    assert hooks.at(0, 3) is hooks.at(1, 3) is twice and hooks.at(1, 0) is stale
    assert hooks.at(1, 1).worker_hook() == "fp8rl_core.checks.faults:worker_requantize_floor"
    assert hooks.names() == ["sampler-requantizes-floor", "post-load-twice", "derived-copy-stale"]
    assert hooks.checks_off(1) == set()  # production and these plants: every check on
    blind = VerlHooks(faults=(PlantedFault(name="expert-copy-negated", rank=1, version=7),
                              PlantedFault(name="expert-copy-negated", rank=1, version=9, checks_off=("compute_copy",))))
    assert blind.checks_off(9) == {"compute_copy"} and blind.checks_off(7) == blind.checks_off(10) == set()
    with pytest.raises(ValueError, match="checks_off"):
        PlantedFault(name="post-load-twice", checks_off=("alarm_and_more",))
    # a series that goes on past its plants (the run's on_failure) and stops at its last one
    stop = VerlHooks(faults=(PlantedFault(name="post-load-twice", version=3),
                             PlantedFault(name="sampler-requantizes-floor", rank=1, version=5, on_failure="fail")))
    assert [stop.on_failure(v) for v in (3, 4, 5)] == [None, None, "fail"] and hooks.on_failure(3) is None
    with pytest.raises(ValueError, match="on_failure"):
        PlantedFault(name="post-load-twice", on_failure="ignore")
    # a plant whose sync is checked at the cheap tier (the cadence set aside there): that sync only
    cheap = VerlHooks(faults=(PlantedFault(name="rotary-cache-nudged", rank=1, version=4, cheap_tier=True),))
    assert [cheap.cheap_tier(v) for v in (3, 4, 5)] == [False, True, False] and not hooks.cheap_tier(1)
    with pytest.raises(ValueError, match="dropped-bucket.*only worker faults"):
        PlantedFault(name="dropped-bucket")
    with pytest.raises(ValueError, match="unknown fault 'nope'"):
        PlantedFault(name="nope")


def test_the_overrides_quantization_is_the_payloads_and_no_spec_file_is_read(run, tmp_path, monkeypatch):
    from fp8rl_core.verl.compose import write_model_config
    from fp8rl_core.verl.overrides import verl_overrides

    def no_reads(self, specs=None):
        raise AssertionError("the model spec file was read again")

    monkeypatch.setattr(RunConfig, "spec", no_reads)
    p = VerlPayload.of(run, tmp_path)
    d = {o.key: o.value for o in verl_overrides(run, p, data_dir=tmp_path)}
    qc = d["actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides"]["quantization_config"]
    assert qc == {"quant_method": "fp8rl", "layers": p.rollout_schemes, "mx_grid": p.mx_grid}
    assert d[f"ray_kwargs.ray_init.runtime_env.env_vars.{PAYLOAD_ENV}"] == str(tmp_path / "payload.json")
    assert json.loads((write_model_config(run, tmp_path / "m") / "config.json").read_text())["vocab_size"] == run.spec.vocab_size
