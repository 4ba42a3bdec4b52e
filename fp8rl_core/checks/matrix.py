"""The detection matrix's verdicts (faults × checks): caught at the first sync by the declared condition,
which checks are necessary (catch a fault no other check catches — or no other *structural* check,
W1–W6: W7 fires on most faults at a tight float32 bound, and whether it does depends on the bound a run
declares) and why the others are redundant on this catalogue.

Pure: :func:`summarize` reads the rows that :func:`fp8rl_core.correctness.inject` and
:func:`fp8rl_core.correctness.clean_series` produce; the heat map is
:func:`fp8rl_core.report.plots.detection_matrix`.
"""

from __future__ import annotations

from fp8rl_core.vocabulary import ENGINE_CHECKSUM, check_column

from .runner import CONDITIONS

__all__ = ["REDUNDANCY_WHY", "summarize"]

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


def summarize(matrix: list[dict], clean: list[dict]) -> dict:
    """Verdicts of the matrix: totals, per-check unique catches, necessity and redundancy; and vLLM's own
    checksums (``vllm_checksum``: the clean syncs it ran on and disagreed on, the faults it fired on)."""
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
    ran = [r for r in clean if r.get(check_column(ENGINE_CHECKSUM)) is not None]
    second = {"clean_syncs_run": len(ran), "clean_syncs_not_run": len(clean) - len(ran),
              "clean_disagreements": sum(not r[check_column(ENGINE_CHECKSUM)] for r in ran),
              "faults_run": sum(r.get(ENGINE_CHECKSUM) is not None for r in matrix),
              "fired_on": [r["fault"] for r in matrix if r.get(ENGINE_CHECKSUM)]}
    return {"faults/total": len(matrix), "faults/caught_first": sum(bool(r["caught_first"]) for r in matrix),
            "clean/syncs": len(clean), "clean/false_alarms": sum(bool(r["false_alarm"]) for r in clean),
            "checks": checks, ENGINE_CHECKSUM: second}
