"""Content identities stay what they were: run ids, sweep ids, spec hashes, warm-start and engine keys of
the committed configs, pinned as computed by the code that recorded the finished sweeps (a sweep finished
before is still found, and skipped, after any change to how the ids are computed); and a sweep's
expansion and dispatch read each model spec once."""

from __future__ import annotations

import pickle
from pathlib import Path


from fp8rl_core.config import correctness_runs, load_sweep, run_id, sweep_id
from fp8rl_core.identity import canonical_json, content_hash, digest
from fp8rl_core.learner.spec import spec_hash
from fp8rl_core.learner.warmstart import warmstart_key
from fp8rl_core.sampler.config import SamplerConfig, engine_key
from fp8rl_core.schedule import dispatch_order, engine_group

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def test_the_smoke_sweeps_run_ids_and_sweep_id_are_pinned():
    _, runs = load_sweep(CONFIGS / "smoke.yaml")
    ids = [r.id for r in runs]
    assert len(ids) == 30 and ids[:3] == ["ab4233665176", "cf44b322307c", "1201399d3668"] and ids[-1] == "f3668dfd0f02"
    assert [run_id(r.config) for r in runs] == ids  # read from the spec file again: the same
    assert sweep_id(runs) == "5b64a9bd10df"
    assert spec_hash(runs[0].spec) == "294de09a220b8fc4864a239f83336c8114a4f5e0a834b51a763456c8fbf37800"
    assert spec_hash(runs[-1].spec) == "8b6ca1b7405ea787bdfa59b2e86f550b8eb6c1c0c7cea2c681e7ade3734af6b8"


def test_gpu_and_correctness_ids_are_pinned():
    _, runs = load_sweep(CONFIGS / "gpu" / "qwen3-8b.yaml")
    assert [r.id for r in runs][:2] == ["cb032811e209", "a403f7c77e79"]
    sweep, _ = load_sweep(CONFIGS / "nightly.yaml")
    assert sweep.correctness.id() == "c926af75bff6"
    assert {k: run_id(v) for k, v in correctness_runs(sweep, CONFIGS / "nightly.yaml").items()} == {
        "dense": "9281b16108b4", "moe": "51366ebb7bb5"}


def test_warm_start_and_engine_keys_are_pinned(monkeypatch):
    _, runs = load_sweep(CONFIGS / "smoke.yaml")
    from fp8rl_core.learner import warmstart

    # the key names the versions it was trained with: set on the modules the warm start reads them from (a
    # test that re-imports transformers leaves sys.modules with another module object than the warm start's)
    monkeypatch.setattr(warmstart.transformers, "__version__", "4.99.0")
    monkeypatch.setattr(warmstart.torch, "__version__", "2.13.0+cpu")
    assert warmstart_key(runs[0].spec, runs[0].config.warmstart) == "473823657db04d1f"
    assert engine_key({"a": 1, "schemes": ["x"]}, SamplerConfig()) == "5a8c33555165eb22"


def test_the_content_hash_is_the_sha256_of_sorted_json():
    assert canonical_json({"b": [1, 2], "a": None}) == '{"a":null,"b":[1,2]}'
    assert canonical_json({"b": 1, "a": 2}, compact=False) == '{"a": 2, "b": 1}'
    assert canonical_json({"p": Path("/x")}) == '{"p":"/x"}'  # no JSON form: its str
    assert digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2's example
    assert content_hash({"b": 1, "a": 2}, 12) == digest('{"a":2,"b":1}')[:12]


def test_a_sweeps_expansion_and_dispatch_read_each_model_spec_once(monkeypatch):
    reads: list[str] = []
    read_text = Path.read_text

    def counted(self, *args, **kwargs):
        if self.suffix == ".yaml" and self.parent.name == "models":
            reads.append(self.name)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    sweep, runs = load_sweep(CONFIGS / "nightly.yaml")  # 12 runs and a correctness section, on two specs
    assert sorted(reads) == ["qwen3-dense-mini.yaml", "qwen3-moe-mini.yaml"]
    # what the sweep's flow does with them before and while dispatching: ids, the expansion's id, names and
    # tags, the order, the engine groups, the runs as Ray ships them to the workers (pickled); Prefect's
    # validation of the experiment flow's parameters: tests/flows/test_pipelines.py
    sweep_id(runs)
    [(r.id, r.name, r.tags, r.description) for r in runs]
    order = dispatch_order(runs)
    groups = [engine_group(runs[i]) for i in order]
    shipped = [pickle.loads(pickle.dumps(r)) for r in runs]
    assert shipped == runs and len(set(groups)) == 12
    assert len(reads) == 2
