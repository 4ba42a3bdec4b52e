"""Clean sync series, fault injection and the detection matrix (faults × checks).

:func:`clean_series` runs RL steps (rollout → GRPO step → sync → checks) and counts false alarms.
:func:`inject` runs one clean step (so the engine is known good), then one step whose sync carries the
fault, records which checks fired at that sync (the first opportunity), and finishes with a clean repair
sync that must pass again. :func:`summarize` turns the rows into the matrix's verdicts — caught at the
first sync by the declared condition, which checks are necessary (catch a fault no other check
catches — or no other *structural* check, W1–W6: W7 fires on most faults at a tight float32 bound, and
whether it does depends on the bound a run declares) and why the others are redundant on this catalogue — and :func:`matrix_png` draws it.
"""

from __future__ import annotations

from pathlib import Path

from fp8rl_core.loop import Pipeline, rollout_and_learn, sync_weights
from fp8rl_core.sync.hooks import NO_HOOKS

from .faults import Fault
from .runner import CONDITIONS, CheckReport, CheckRunner

__all__ = ["REDUNDANCY_WHY", "clean_series", "inject", "matrix_png", "summarize"]

#: why a check can fire only together with others on this catalogue (used when it has no unique catch)
REDUNDANCY_WHY = {
    "W1": "a tensor left unwritten usually also holds other bytes than the learner's (W2/W4); W1 alone "
          "sees it when the stale bytes happen to equal the new ones, and names the missing sync",
    "W2": "any change of on-grid bytes also moves behaviour (W7) or placement (W3) when large",
    "W3": "a misplaced on-grid slot also changes bytes at its named position (W2), an off-grid one values "
          "(W4); W3 is the check that finds order and orientation by content, without the name-based "
          "layout table the exporter and the W2/W4 expectations share, and names the permutation",
    "W4": "a wrong grid on a layer also changes its bytes or names (W1/W2)",
    "W5": "stale content under a new tag also differs from the current bytes (W2/W4) whenever the "
          "optimizer step moved a byte; W5 is the check that names it a version fault",
    "W6": "a stale derived copy also moves behaviour (W7)",
    "W7": "every fault in the catalogue breaks a structural condition first; W7 is the end-to-end "
          "backstop for what the structural checks cannot read (prepacked BF16 experts, kernels)",
}


def _tags(row: dict) -> list[tuple[int, int]]:
    return [(int(row["version"]), int(row["new_version"]) - 1)]


def step(pipe: Pipeline, runner: CheckRunner, task, index: int, *, prompts_per_step: int, seed: int,
         fault: Fault | None = None) -> tuple[dict, CheckReport]:
    """One RL step with its sync (optionally faulty) and the checks after it."""
    if fault is not None and fault.captures_pre_step:
        pipe.pre_step_export = pipe.export()
    row, _ = rollout_and_learn(pipe, task, index, prompts_per_step=prompts_per_step, seed=seed)
    row |= sync_weights(pipe, fault or NO_HOOKS)
    report = runner.check(pipe, _tags(row))
    row["checks_s"] = report.seconds
    return row, report


def clean_series(pipe: Pipeline, runner: CheckRunner, task, syncs: int, *, prompts_per_step: int = 4,
                 seed: int = 0, on_sync=None) -> list[dict]:
    """``syncs`` clean RL steps; one row per sync: the checks' verdicts, tier and timings."""
    rows = []
    first = pipe.learner.version + 1
    for i in range(first, first + syncs):
        row, report = step(pipe, runner, task, i, prompts_per_step=prompts_per_step, seed=seed)
        out = {"sync": report.sync, "version": report.version, "tier": "full" if report.full else "cheap",
               "false_alarm": bool(report.failed), "alarms": report.message(), "checks_s": report.seconds,
               "step_s": row["generate_s"] + row["learner_s"] + row["export_s"] + row["transport_s"] + row["load_s"]
               + row["reset_s"], "mean_reward": row["mean_reward"]}
        out |= {f"check/{c}": r.passed for c, r in report.results_by.items()}
        rows.append(out)
        if on_sync is not None:
            on_sync(out)
    return rows


def inject(pipe: Pipeline, runner: CheckRunner, task, fault: Fault, *, prompts_per_step: int = 4, seed: int = 0,
           warmup: bool = True) -> dict:
    """The fault's row of the detection matrix (see the module docstring). ``warmup=False`` for faults
    present from the engine's start (``config``): their first sync is the first opportunity."""
    pre = None
    if warmup:
        _, pre = step(pipe, runner, task, pipe.learner.version + 1, prompts_per_step=prompts_per_step, seed=seed)
    _, rep = step(pipe, runner, task, pipe.learner.version + 1, prompts_per_step=prompts_per_step, seed=seed,
                  fault=fault)
    fired = {c: (not rep.results_by[c].passed) if c in rep.results_by else None for c in CONDITIONS}
    declared = rep.results_by.get(fault.condition)
    row = {"fault": fault.name, "condition": fault.condition, "stage": fault.stage, "model": fault.model,
           "what": fault.what, "tier": "full" if rep.full else "cheap", "why": rep.why,
           "warmup_clean": None if pre is None else not pre.failed,
           "caught_first": bool(fired.get(fault.condition)),
           "declared_offenders": "; ".join((declared.offenders if declared else [])[:3])}
    row |= {c: (None if v is None else int(v)) for c, v in fired.items()}
    if fault.engine_schemes is None:  # repair: a clean sync of the same version must pass again
        sync_weights(pipe)
        rep2 = runner.check(pipe, [])
        row["repaired"] = not rep2.failed
    return row


def summarize(matrix: list[dict], clean: list[dict]) -> dict:
    """Verdicts of the matrix: totals, per-check unique catches, necessity and redundancy."""
    unique: dict[str, list[str]] = {c: [] for c in CONDITIONS}
    structural: dict[str, list[str]] = {c: [] for c in CONDITIONS}
    fired_by: dict[str, list[str]] = {c: [] for c in CONDITIONS}
    for r in matrix:
        on = [c for c in CONDITIONS if r.get(c)]
        for c in on:
            fired_by[c].append(r["fault"])
        if len(on) == 1:
            unique[on[0]].append(r["fault"])
        struct = [c for c in on if c != "W7"]
        if len(struct) == 1:
            structural[struct[0]].append(r["fault"])
    checks = {}
    for c in CONDITIONS:
        necessary = bool(unique[c] or (c != "W7" and structural[c]))
        co = sorted({o for r in matrix if r.get(c) for o in CONDITIONS if o != c and r.get(o)})
        checks[c] = {"fired_on": fired_by[c], "unique": unique[c], "unique_among_w1_w6": structural[c],
                     "necessary": necessary,
                     "why_redundant": "" if necessary else (
                         f"never fired alone; fired with {', '.join(co) or 'nothing'} — {REDUNDANCY_WHY[c]}"
                         if fired_by[c] else f"fired on no fault — {REDUNDANCY_WHY[c]}")}
    return {"faults/total": len(matrix), "faults/caught_first": sum(bool(r["caught_first"]) for r in matrix),
            "clean/syncs": len(clean), "clean/false_alarms": sum(bool(r["false_alarm"]) for r in clean),
            "checks": checks}


def matrix_png(matrix: list[dict], path: str | Path, title: str = "fp8rl detection matrix") -> Path:
    """Heat map: faults (rows) × checks (columns). Dark green = the declared check fired; light = another
    check fired; red = the declared check did not fire; grey = the check did not run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    codes = []
    for r in matrix:
        row = []
        for c in CONDITIONS:
            v = r.get(c)
            if v is None:
                row.append(0)
            elif c == r["condition"]:
                row.append(3 if v else 4)
            else:
                row.append(2 if v else 1)
        codes.append(row)
    cmap = ListedColormap(["#d9d9d9", "#ffffff", "#a1d99b", "#238b45", "#de2d26"])
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(matrix) + 1.6))
    ax.imshow(codes, cmap=cmap, vmin=0, vmax=4, aspect="auto")
    ax.set_xticks(range(len(CONDITIONS)), CONDITIONS)
    ax.set_yticks(range(len(matrix)), [f"{r['fault']} ({r['condition']})" for r in matrix])
    ax.set_xlabel("check that fired at the fault's first sync")
    ax.xaxis.set_label_position("top")
    ax.xaxis.tick_top()
    for i, r in enumerate(matrix):
        for j, c in enumerate(CONDITIONS):
            v = r.get(c)
            ax.text(j, i, "–" if v is None else ("✓" if v else ""), ha="center", va="center", fontsize=9,
                    color="white" if codes[i][j] in (3, 4) else "black")
    ax.set_xticks([x - 0.5 for x in range(1, len(CONDITIONS))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(matrix))], minor=True)
    ax.grid(which="minor", color="#bbbbbb", linewidth=0.5)
    caught = sum(bool(r["caught_first"]) for r in matrix)
    ax.set_title(f"{title}: {caught}/{len(matrix)} caught at the first sync by the declared check\n"
                 "dark green: declared check fired · light green: another check fired · red: declared missed",
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
