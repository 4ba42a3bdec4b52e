"""The report's power rows (fp8rl_core.report.power.power_rows) on planted probe tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fp8rl_core.metrics import paired_units
from fp8rl_core.metrics.power import power_estimate, seeds_needed
from fp8rl_core.report import CLAIMS, SweepData, evaluate_claims, power_rows, probe_units, write_report

from .sweeps import DENSE, MOE, make_sweep
from .test_probe import with_probe


@pytest.fixture(scope="module")
def sweep():
    return with_probe(make_sweep(seeds=(0, 1, 2), steps=False, checks=False))


def _seed_dependent(sweep: SweepData) -> SweepData:
    """half's KL scaled by a per-seed factor e^{−0.3}, 1, e^{0.3}: the seeds' ratios differ."""
    probe = sweep.probe.copy()
    factor = probe["seed"].map({0: np.exp(-0.3), 1: 1.0, 2: np.exp(0.3)})
    half = probe["preset"] == "half"
    probe.loc[half, "kl"] = probe.loc[half, "kl"] * factor[half]
    return SweepData(**{**sweep.__dict__, "probe": probe})


def test_one_row_per_kl_claim_and_model_with_the_estimate_of_its_paired_units(sweep):
    rows = power_rows(sweep)
    assert sorted((r.id, r.model) for r in rows) == sorted(
        [("a", DENSE), ("a", MOE), ("b", DENSE), ("b", MOE), ("d", MOE), ("e", DENSE), ("e", MOE)])
    (row,) = [r for r in rows if r.id == "a" and r.model == DENSE]
    units = probe_units(sweep, "probe_kl")
    ua, ub = units[(DENSE, "bf16-sampler")], units[(DENSE, "half")]
    a, b, keys = paired_units(ua.keys, (ua.num, ua.den), ub.keys, (ub.num, ub.den))
    assert row.estimate == power_estimate(a, b, keys[:, 0], target=0.89)
    assert (row.seeds, row.sequences, row.target) == (3, 16, 0.89)
    assert row.seeds_for_target == seeds_needed(row.estimate.components, 0.89, 16)


def test_shared_difficulty_and_small_jitter_resolve_small_ratios(sweep):
    # the planted per-run jitter is σ = 0.02 in log: paired z has σ ≈ 0.02·√2 per unit, no seed effect
    row = next(r for r in power_rows(sweep) if r.id == "b" and r.model == DENSE)
    assert row.within == pytest.approx(2 * 0.02**2, rel=0.5)
    assert row.resolvable < 1.05
    assert row.seeds_for_target <= 2


def test_a_seed_dependent_ratio_needs_more_seeds(sweep):
    noisy = _seed_dependent(sweep)  # σ²_between grows
    quiet = next(r for r in power_rows(sweep) if r.id == "a" and r.model == DENSE)
    loud = next(r for r in power_rows(noisy) if r.id == "a" and r.model == DENSE)
    assert loud.between > 100 * max(quiet.between, 1e-6)
    assert loud.resolvable > 1.3 and loud.seeds_for_target > 10 * quiet.seeds_for_target
    # a design with more seeds resolves smaller ratios
    more = next(r for r in power_rows(noisy, seeds=30) if r.id == "a" and r.model == DENSE)
    assert more.seeds == 30 and more.resolvable < loud.resolvable


def test_an_unresolved_claim_row_states_the_power_calculation(sweep):
    noisy = _seed_dependent(sweep)
    claims = [c for c in CLAIMS if c.id == "a"]
    row = next(r for r in evaluate_claims(noisy, n_boot=200, claims=claims)
               if r.model == DENSE and r.measure == "probe_kl")
    p = next(r for r in power_rows(noisy) if r.id == "a" and r.model == DENSE)
    assert row.lo <= 1 <= row.hi and row.verdict == "unresolved"
    n = p.estimate.needed
    assert n.groups == p.seeds_for_target and n.per_group == 16 and n.have == 3 and not n.enough
    assert row.why.endswith(
        f"; power: 3 seeds × 16 probe sequences resolve only ratios ≤ {1 / p.resolvable:.2f} or ≥ {p.resolvable:.2f} "
        f"(80% power); a resolution of the paper's 0.89 at 80% power needs {p.seeds_for_target} seeds × 16 sequences "
        f"(σ²_between rests on 3 seeds only; at least {n.floor} however many sequences; this design: 3)")
    # a resolved row (quiet sweep: the planted 0.917 with 2% jitter) carries no power note
    quiet = next(r for r in evaluate_claims(sweep, n_boot=200, claims=claims)
                 if r.model == DENSE and r.measure == "probe_kl")
    assert quiet.hi < 1 and "power:" not in quiet.why


def test_no_probe_table_or_one_seed_gives_no_rows(sweep):
    assert power_rows(SweepData(**{**sweep.__dict__, "probe": pd.DataFrame()})) == []
    one = with_probe(make_sweep(seeds=(0,), steps=False, checks=False))
    assert power_rows(one) == []


def test_the_report_has_a_power_section(sweep, tmp_path):
    text = write_report(sweep, tmp_path, n_boot=50).read_text()
    assert "## Power" in text
    assert "| half vs bf16-sampler (a) | " + DENSE + " | 3 × 16 |" in text
