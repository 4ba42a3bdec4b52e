"""The report's figures: each writes a real PNG (a valid image of sane size with a drawing on it, shaped as
its panels are laid out), and draws what the data says —
the planted KL levels in preset order, the break-even marker where the cost model finds one (and the
verdict box where it does not), stacked step phases that add up to the step time."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fp8rl_core.metrics import cost_model
from fp8rl_core.report import interval_table, plots, preset_order, with_run_columns

from .sweeps import DENSE, MOE, cost_sweep, make_sweep

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep():
    return make_sweep()


def png_size(path) -> tuple[int, int]:
    """(width, height) of ``path`` after checking it is a PNG a viewer opens, of a sane size (0.2–4 k px a
    side) and with a drawing on it: some ink (not blank, not a solid fill) in more than a few colours."""
    with open(path, "rb") as fh:
        assert fh.read(8) == PNG_SIGNATURE
    with Image.open(path) as im:
        im.verify()  # the chunks and their CRCs
    with Image.open(path) as im:
        px = np.asarray(im.convert("RGB"))
    h, w, _ = px.shape
    assert 200 <= w <= 4000 and 200 <= h <= 4000, (w, h)
    ink = float((px < 240).any(axis=-1).mean())  # share of pixels that are not (near) white
    assert 0.01 < ink < 0.9, ink
    assert len(np.unique(px.reshape(-1, 3), axis=0)) >= 16  # lines, text, markers: more than a few colours
    return w, h


def by_gid(fig, gid):
    return [a for ax in fig.axes for a in ax.findobj() if a.get_gid() == gid]


# -------------------------------------------------------------------------------------- KL figures

@pytest.mark.parametrize("metric", ["k3", "mean_abs_logprob_diff"])
def test_kl_by_preset_writes_a_png(sweep, tmp_path, metric):
    path = plots.kl_by_preset(sweep, tmp_path / f"{metric}.png", metric, n_boot=200)
    assert path == tmp_path / f"{metric}.png"
    w, h = png_size(path)
    assert 1.8 * h < w < 2.6 * h  # one panel widened for 5 presets (figsize 9.0 × 4.2 in)


def test_kl_by_preset_draws_each_models_estimates_in_axis_order(sweep):
    sweep_axis = make_sweep(presets=("all", "other-grid", "bf16-e2e"), models=(MOE,), steps=False, checks=False)
    sweep_axis.presets = ["all", "other-grid", "bf16-e2e"]  # the moe-grids file order
    fig = plots.kl_by_preset_figure(sweep_axis, "k3", n_boot=200)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["all", "other-grid", "bf16-e2e"]
    (line,) = by_gid(fig, f"kl-{MOE}")
    table = interval_table(sweep_axis, ["k3"], n_boot=200)
    assert list(line.get_ydata()) == pytest.approx(list(table["estimate"]))
    assert list(table["preset"]) == ["all", "other-grid", "bf16-e2e"]
    assert "n = 3 seeds" in ax.get_title()
    plots._pyplot().close(fig)


@pytest.mark.parametrize("estimates,scale", [([1e-4, 5e-3, 2e-2], "log"), ([0.010, 0.012, 0.015], "linear")])
def test_kl_by_preset_from_rows_uses_a_log_axis_when_values_span_decades(estimates, scale):
    rows = [{"preset": p, "estimate": e, "lo": 0.9 * e, "hi": 1.1 * e, "seeds": 3}
            for p, e in zip(["bf16-e2e", "bf16-sampler", "all"], estimates)]
    fig = plots.kl_by_preset_figure(rows, "k3")
    assert fig.axes[0].get_yscale() == scale
    (line,) = by_gid(fig, "kl-")
    assert list(line.get_ydata()) == pytest.approx(estimates)
    plots._pyplot().close(fig)


def test_kl_over_steps_has_a_panel_per_model_and_a_line_per_preset(sweep, tmp_path):
    fig = plots.kl_over_steps_figure(sweep, "k3", n_boot=200)
    assert len(fig.axes) == 2 and [ax.get_title().split(" (")[0] for ax in fig.axes] == [DENSE, MOE]
    per_step = interval_table(sweep, ["k3"], per_step=True, n_boot=200)
    for preset in preset_order(sweep):
        lines = by_gid(fig, f"kl-{preset}")
        assert len(lines) == 2  # one per model
        want = per_step[(per_step["model"] == DENSE) & (per_step["preset"] == preset)]["estimate"]
        assert list(lines[0].get_xdata()) == [1, 2]
        assert list(lines[0].get_ydata()) == pytest.approx(list(want))
    plots._pyplot().close(fig)
    path = plots.kl_over_steps(sweep, tmp_path / "steps.png", n_boot=200)
    w, h = png_size(path)
    assert w > 2.5 * h  # two panels side by side (figsize 12.4 × 4.0 in)
    assert not any(c.get_gid() for ax in fig.axes for c in ax.collections if str(c.get_gid()).startswith("events"))


def test_kl_over_steps_marks_the_alarms_mismatch_events_at_their_step_and_preset(sweep):
    """A step whose sync recorded a mismatch event (the alarm's suspicion, dismissed by the full tier) is marked on
    that preset's line of that model's panel, at the step's estimate; the others are not."""
    steps = sweep.steps.copy()
    cols = with_run_columns(steps, sweep.runs, ["model", "preset", "seed"])
    hit = (cols["model"] == DENSE) & (cols["preset"] == "all") & (steps["step"] == 2)
    steps["check/alarm_events"] = np.where(hit & (cols["seed"] == cols["seed"].min()), 1.0, 0.0)
    data = type(sweep)(**{**sweep.__dict__, "steps": steps})
    assert plots.alarm_events(data) == {(DENSE, "all"): {2: 1}}
    fig = plots.kl_over_steps_figure(data, "k3", n_boot=200)
    marks = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "events-all"]
    assert len(marks) == 1 and marks[0].axes is fig.axes[0]
    (line,) = [ln for ln in fig.axes[0].lines if ln.get_gid() == "kl-all"]
    assert marks[0].get_offsets().tolist() == [[2.0, pytest.approx(line.get_ydata()[1])]]
    plots._pyplot().close(fig)


def test_reward_over_steps_draws_every_seed_and_the_mean_per_preset(sweep, tmp_path):
    steps = sweep.steps.copy()
    steps["mean_reward"] = 0.1 * steps["step"] + 0.01 * with_run_columns(steps, sweep.runs, ["seed"])["seed"]
    data = type(sweep)(**{**sweep.__dict__, "steps": steps})
    fig = plots.reward_over_steps_figure(data)
    assert [ax.get_title().split(" (")[0] for ax in fig.axes[:2]] == [DENSE, MOE]
    for preset in preset_order(data):
        (dense, _moe) = by_gid(fig, f"reward-{preset}")  # the mean line, one per model
        assert list(dense.get_xdata()) == [1, 2]
        assert list(dense.get_ydata()) == pytest.approx([0.1 + 0.01, 0.2 + 0.01])  # seeds 0, 1, 2: mean 1
    n_seeds = data.runs["seed"].nunique()
    assert len(fig.axes[0].get_lines()) == len(preset_order(data)) * (n_seeds + 1)  # a thin line per seed
    plots._pyplot().close(fig)
    assert png_size(plots.reward_over_steps(data, tmp_path / "reward.png"))[0] > 0
    with pytest.raises(ValueError, match="no rewards to plot"):
        plots.reward_over_steps_figure(type(sweep)(**{**sweep.__dict__, "steps": steps.iloc[0:0]}))


# ----------------------------------------------------------------------------------- micro-batches

def test_microbatch_time_marks_a_planted_break_even(tmp_path):
    data = cost_sweep(bf16=(2e-3, 3e-6), mxfp8=(6e-3, 1e-6), emulated=False)
    cm = cost_model(data.microbatches, n_boot=300)
    assert cm.status == "break_even" and cm.break_even == pytest.approx(2000, rel=0.05)
    fig = plots.microbatch_time_figure(data.microbatches, cm)
    (marker,) = by_gid(fig, "break-even")
    assert marker.get_xdata()[0] == pytest.approx(cm.break_even, rel=1e-12)
    assert by_gid(fig, "break-even-ci") and not by_gid(fig, "verdict")
    (fit,) = by_gid(fig, "fit-bf16")
    x, y = fit.get_xdata(), fit.get_ydata()
    assert y == pytest.approx(cm.fits["bf16"].fixed + cm.fits["bf16"].per_token * x)
    assert fig.axes[0].get_xscale() == "log"  # 256 … 4096 tokens span more than a decade
    plots._pyplot().close(fig)
    path = plots.microbatch_time(data.microbatches, cm, tmp_path / "mb.png")
    w, h = png_size(path)
    assert h < w < 2 * h  # one panel (figsize 6.8 × 4.4 in)


def test_microbatch_time_without_break_even_shows_the_verdict():
    data = cost_sweep(bf16=(2e-3, 1e-6), mxfp8=(5e-3, 1.5e-6))
    cm = cost_model(data.microbatches, n_boot=200, emulated=True)
    fig = plots.microbatch_time_figure(data.microbatches, cm)
    assert not by_gid(fig, "break-even")
    (box,) = by_gid(fig, "verdict")
    assert box.get_text().replace("\n", " ").startswith("no break-even: mxfp8 costs more per token")
    plots._pyplot().close(fig)


# ---------------------------------------------------------------------------------- step breakdown

def test_step_breakdown_stacks_the_phases_to_the_step_time(sweep, tmp_path):
    steps = with_run_columns(sweep.steps, sweep.runs, ["preset", "model", "seed"])
    fig = plots.step_breakdown_figure(steps, presets=preset_order(sweep))
    bars = by_gid(fig, "phase-generate_s")
    assert len(bars) == 10  # 2 models × 5 presets
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels[:2] == [f"bf16-e2e\n{DENSE}", f"bf16-sampler\n{DENSE}"]
    i = labels.index(f"all\n{MOE}")
    sel = steps[(steps["model"] == MOE) & (steps["preset"] == "all")]
    assert bars[i].get_height() == pytest.approx(sel["generate_s"].mean())
    top = max(b.get_y() + b.get_height() for b in fig.axes[0].patches if b.get_x() < i + 0.5 and b.get_x() > i - 0.5)
    assert top == pytest.approx(sel["total_s"].mean())  # the untimed rest tops the stack up to total_s
    plots._pyplot().close(fig)
    path = plots.step_breakdown(steps, tmp_path / "steps.png")
    w, h = png_size(path)
    assert w > 2.5 * h  # widened for 10 bars (figsize 14.0 × 4.4 in)


def test_step_breakdown_needs_a_preset_column(sweep):
    with pytest.raises(ValueError, match="needs a 'preset' column"):
        plots.step_breakdown_figure(sweep.steps)


# --------------------------------------------------------------------------------- detection matrix

def test_detection_matrix_writes_the_heat_map(tmp_path):
    cheap = ("W1", "W2", "W4", "W5", "W6")
    rows = [{"fault": f, "condition": c, "caught_first": True, **{w: int(w == c) for w in cheap}, "W3": None,
             "W7": None} for f, c in (("drop-bucket", "W1"), ("requant", "W2"))]
    path = plots.detection_matrix(rows, tmp_path / "matrix.png")
    w, h = png_size(path)
    assert w > 2 * h  # two fault rows under seven condition columns (figsize 7.5 × 2.4 in)


def test_detection_matrix_figure_colours_each_cell_by_what_fired():
    """Codes drawn: 0 not run (grey, a dash), 1 another check passed, 2 another check fired, 3 the declared
    check fired, 4 the declared check missed (red); the title counts the faults caught first."""
    rows = [{"fault": "drop-bucket", "condition": "W1", "caught_first": True, "W1": 1, "W2": 1, "W3": None,
             "W4": 0, "W5": 0, "W6": 0, "W7": None},
            {"fault": "requant", "condition": "W2", "caught_first": False, "W1": 0, "W2": 0, "W3": 1, "W4": 0,
             "W5": 0, "W6": 0, "W7": 1}]
    fig = plots.detection_matrix_figure(rows, title="t")
    ax = fig.axes[0]
    assert ax.images[0].get_array().tolist() == [[3, 2, 0, 1, 1, 1, 0], [1, 4, 2, 1, 1, 1, 2]]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["W1", "W2", "W3", "W4", "W5", "W6", "W7"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["drop-bucket (W1)", "requant (W2)"]
    assert [t.get_text() for t in ax.texts[:7]] == ["✓", "✓", "–", "", "", "", "–"]
    assert ax.get_title().startswith("t: 1/2 caught at the first sync by the declared check")


def test_figures_are_deterministic(sweep, tmp_path):
    a = plots.kl_by_preset(sweep, tmp_path / "a.png", n_boot=200)
    b = plots.kl_by_preset(sweep, tmp_path / "b.png", n_boot=200)
    assert np.array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b)))


def test_run_figures_plot_kl_and_reward_per_step_and_the_logprob_difference_histogram(tmp_path):
    from fp8rl_core.metrics.summary import run_kl_summary

    from .sweeps import step_rows, token_rows

    tokens = token_rows("all", 0, delta=0.1)
    tokens[0] = tokens[0] | {"learner_logprob": tokens[0]["sampler_logprob"]}  # one exact agreement
    kl = run_kl_summary(tokens, run_id="r", preset="all", model=DENSE, seed=0, n_boot=50)
    steps = step_rows("all", DENSE, 0)
    fig = plots.run_steps_figure(steps, kl, "title")
    (line,) = [a for ax in fig.axes for a in ax.lines if a.get_gid() == "kl"]
    step_rows_kl = [r for r in kl if r["step"] is not None]
    assert list(line.get_xdata()) == [r["step"] for r in step_rows_kl]
    assert np.allclose(line.get_ydata(), [r["k3"] * 1e6 for r in step_rows_kl])  # µnats
    (reward,) = [a for ax in fig.axes for a in ax.lines if a.get_gid() == "reward"]
    assert list(reward.get_ydata()) == [s["mean_reward"] for s in steps]
    assert not [c for ax in fig.axes for c in ax.collections if c.get_gid() == "events"]
    flagged = [s | {"check/alarm_events": float(s["step"] == 2)} for s in steps]
    (mark,) = [c for ax in plots.run_steps_figure(flagged, kl, "t").axes for c in ax.collections if c.get_gid() == "events"]
    assert mark.get_offsets().tolist() == [[2.0, pytest.approx(step_rows_kl[1]["k3"] * 1e6)]]
    hist = plots.logprob_diff_histogram_figure(tokens)
    (note,) = [t for t in hist.axes[0].texts if t.get_gid() == "exact"]
    assert note.get_text().startswith(f"{len(tokens)} tokens, 1 identical")
    assert sum(p.get_height() for p in hist.axes[0].patches) == len(tokens) - 1  # the rest, binned
    paths = plots.run_figures(steps, kl, tokens, tmp_path / "figs", "title")
    assert [p.name for p in paths] == ["kl_reward_per_step.png", "abs_dlogp_hist.png"]
    assert all(Image.open(p).size[0] > 300 for p in paths)
