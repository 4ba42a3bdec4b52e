"""Content identities stay what they were: run ids, sweep ids, spec hashes, warm-start and engine keys of
the committed configs, pinned as computed by the code that recorded the finished sweeps (a sweep finished
before is still found, and skipped, after any change to how the ids are computed); and a sweep's
expansion and dispatch read each model spec once."""

from __future__ import annotations

import pickle
from pathlib import Path


from fp8rl_core.config.runs import Sweep, run_id, sweep_id
from fp8rl_core.identity import canonical_json, content_hash, digest
from fp8rl_core.learner.spec import spec_hash
from fp8rl_core.learner.warmstart import warmstart_key
from fp8rl_core.sampler.config import SamplerConfig, engine_key
from fp8rl_core.schedule import dispatch_order, engine_group

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def test_the_smoke_sweeps_run_ids_and_sweep_id_are_pinned():
    runs = Sweep.load(CONFIGS / "smoke.yaml").runs
    ids = [r.id for r in runs]
    assert len(ids) == 30 and ids[:3] == ["ab4233665176", "cf44b322307c", "1201399d3668"] and ids[-1] == "f3668dfd0f02"
    assert [run_id(r.config) for r in runs] == ids  # read from the spec file again: the same
    assert sweep_id(runs) == "5b64a9bd10df"
    assert spec_hash(runs[0].spec) == "294de09a220b8fc4864a239f83336c8114a4f5e0a834b51a763456c8fbf37800"
    assert spec_hash(runs[-1].spec) == "8b6ca1b7405ea787bdfa59b2e86f550b8eb6c1c0c7cea2c681e7ade3734af6b8"


def test_gpu_and_correctness_ids_are_pinned(gsm8k_home):
    runs = Sweep.load(CONFIGS / "gpu" / "qwen3-8b.yaml").runs  # on the test's GSM8K files (their hash is in the ids)
    assert [r.id for r in runs][:2] == ["3f88ac8290e4", "bed6cb11ef64"]
    sweep = Sweep.load(CONFIGS / "nightly.yaml")
    assert sweep.config.correctness.id() == "c926af75bff6"
    assert {k: run_id(v.config) for k, v in sweep.correctness.items()} == {"dense": "9281b16108b4", "moe": "51366ebb7bb5"}
    assert {k: v.id for k, v in sweep.correctness.items()} == {"dense": "9281b16108b4", "moe": "51366ebb7bb5"}


#: every shipped sweep as the code that recorded the finished sweeps expanded it: (sweep, runs, first run's id,
#: sweep id — the hash of every run's id, in order —, correctness section's id, its runs' ids)
SHIPPED = {
    "clean-long.yaml": ("clean-long", 18, "45c90bc71848", "a2b988b27b31", None, {}),
    "dense-matching-small.yaml": ("dense-matching-small", 16, "c75b042b2610", "8a93e55b6fe8", None, {}),
    "dense-matching.yaml": ("dense-matching", 12, "a1d1cde3b7ca", "ea5688a9d92b", None, {}),
    "gpu/qwen3-30b-a3b.yaml": ("gpu-qwen3-30b-a3b", 18, "4170d60d62db", "a0734642aeb0", None, {}),  # gsm8k_home's files
    "gpu/qwen3-8b.yaml": ("gpu-qwen3-8b", 18, "3f88ac8290e4", "ee1a4f3d776f", None, {}),
    "matching-fixed-weights.yaml": ("matching-fixed-weights", 6, "42c7f7d38631", "28dd5d45d196", None, {}),
    "matching-engines.yaml": ("matching-engines", 3, "6afb97ce3665", "a3e84406911b", None, {}),
    "microbatch-sweep.yaml": ("microbatch-sweep", 30, "5c62214447bf", "723807d0b15b", None, {}),
    "moe-grids-small.yaml": ("moe-grids-small", 32, "4a4681421fb5", "ed7d3f96ad06", None, {}),
    "moe-grids.yaml": ("moe-grids", 12, "5c41f1ec8fbb", "f41b38947f60", None, {}),
    "nightly-verl.yaml": ("nightly-verl", 2, "3782ad7bb98e", "7a3a41c46de4", "2cf65ac65051", {"moe": "1f2b602ea631"}),  # + norm-eps-changed
    "nightly.yaml": ("nightly", 12, "6c7379e9b435", "4352d9a733dc", "c926af75bff6",
                     {"dense": "9281b16108b4", "moe": "51366ebb7bb5"}),
    "smoke.yaml": ("smoke", 30, "ab4233665176", "5b64a9bd10df", None, {}),
    "verl-smoke.yaml": ("verl-smoke", 8, "e96e9fd9c807", "31ec29b71655", None, {}),
}


def test_every_shipped_sweeps_run_ids_are_pinned(gsm8k_home):
    """A sweep of configs/ finished before a change to the config code is skipped after it: its expansion
    gives the same run ids in the same order (the sweep id hashes them all) and correctness ids."""
    found = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml") if "models" not in p.parts)
    assert found == sorted(SHIPPED)  # a new config is pinned here too
    for name, (sweep, n, first, expansion, stage, correctness) in SHIPPED.items():
        loaded = Sweep.load(CONFIGS / name)
        assert (loaded.name, len(loaded.runs), loaded.runs[0].id, loaded.id) == (sweep, n, first, expansion), name
        assert loaded.config.correctness is None if stage is None else loaded.config.correctness.id() == stage, name
        assert {k: r.id for k, r in loaded.correctness.items()} == correctness, name


def test_warm_start_and_engine_keys_are_pinned(monkeypatch):
    runs = Sweep.load(CONFIGS / "smoke.yaml").runs
    from fp8rl_core.learner import warmstart

    # the key names the versions it was trained with: set on the modules the warm start reads them from (it
    # imports transformers where it builds the key)
    import transformers

    monkeypatch.setattr(transformers, "__version__", "4.99.0")
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
    runs = Sweep.load(CONFIGS / "nightly.yaml").runs  # 12 runs and a correctness section's 2, on two specs
    assert sorted(reads) == ["qwen3-dense-mini.yaml", "qwen3-moe-mini.yaml"]
    # what the sweep's flow does with them before and while dispatching: ids, the expansion's id, names and
    # tags, the order, the engine groups, the runs as Ray ships them to the workers (pickled); Prefect's
    # validation of the experiment flow's parameters: tests/flows/test_pipelines.py
    sweep_id(runs)
    [(r.id, r.name, r.tags, r.description) for r in runs]
    order = dispatch_order(runs)
    groups = [engine_group(runs[i]) for i in order]
    shipped = [pickle.loads(pickle.dumps(r)) for r in runs]
    assert shipped == list(runs) and len(set(groups)) == 12
    assert len(reads) == 2
