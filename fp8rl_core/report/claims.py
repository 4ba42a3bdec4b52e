"""The paper's claims as data: :data:`CLAIMS` holds each statement of docs/design.md ("Reference results":
dense Qwen3-8B, MoE Qwen3-30B-A3B, B200, single seed) with its number, how it is measured and what a
sweep must contain to test it. :func:`claims_table` renders them as a table (for docs and reports);
:mod:`fp8rl_core.report.verdicts` measures each on a sweep and gives its verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["CLAIMS", "MEASURE_LABELS", "PROBE_MEASURE", "VERDICTS", "Claim", "Verdict", "claims_table",
           "measure_label"]

#: the primary KL measure of the KL claims when the sweep has a probe table (a report metric name)
PROBE_MEASURE = "probe_kl"
#: a KL measure's name in a claim row's text (``"… — exact probe KL"``); other metrics: "sampled-token <metric>"
MEASURE_LABELS = {"probe_kl": "exact probe KL", "probe_kl_rev": "exact probe KL(learner‖sampler)",
                  "probe_js": "exact probe JS"}

#: a claim's verdict on a sweep
Verdict = Literal["reproduced", "not reproduced", "not measurable here"]
VERDICTS: tuple[str, ...] = get_args(Verdict)


@dataclass(frozen=True)
class Claim:
    """One statement of the paper.

    ``kind`` says how it is measured: ``kl_ratio`` (KL of ``candidate`` / KL of ``baseline``),
    ``kl_ratio_first_step`` (the same, whole run and step 1), ``sync`` (W2 rows), ``cost_fixed`` /
    ``cost_break_even`` (the micro-batch cost model), ``trace`` (GPU idle analysis), ``time_ratio``
    (``metric`` = a steps-table time column, candidate / baseline). ``paper_ratio`` / ``paper_range``:
    the paper's number, ``direction``: ``"lower"`` or ``"higher"`` (the claimed side of 1),
    ``models``: which models it is about (``"any"``, ``"dense"``, ``"moe"``), ``note``: why the
    comparison is set up this way, when that is a choice."""

    id: str
    text: str
    paper: str
    kind: str
    baseline: str | None = None
    candidate: str | None = None
    metric: str = "k3"
    paper_ratio: float | None = None
    paper_range: tuple[float, float] | None = None
    direction: str | None = None
    models: str = "any"
    note: str = ""

    @property
    def needs(self) -> str:
        """What a sweep must contain for this claim, in words."""
        if self.kind in ("kl_ratio", "kl_ratio_first_step", "time_ratio"):
            model = {"any": "", "dense": "a dense model, ", "moe": "a MoE model, "}[self.models]
            table = "their tokens table" if self.kind != "time_ratio" else "a steps table or run time metrics"
            return f"{model}presets {self.candidate} and {self.baseline} with {table}"
        if self.kind == "sync":
            return "a checks table with W2 rows"
        if self.kind.startswith("cost"):
            return "micro-batch timings of a BF16 and an MXFP8 learner"
        return "a GPU profiler trace of each precision"


CLAIMS: tuple[Claim, ...] = (
    Claim("a", "half-on-grid sampler: KL 11% lower than a BF16 sampler (MXFP8 learner)", "11% lower (ratio 0.89)",
          "kl_ratio", "bf16-sampler", "half", paper_ratio=0.89, direction="lower"),
    Claim("b", "all-on-grid sampler: KL 16% lower than a BF16 sampler (MXFP8 learner)", "16% lower (ratio 0.84)",
          "kl_ratio", "bf16-sampler", "all", paper_ratio=0.84, direction="lower"),
    Claim("c", "synced weights equal the learner's FP8 forward weights byte for byte", "byte for byte at every sync",
          "sync"),
    Claim("d", "MoE: a sampler on another FP8 grid has ≈2× the KL of the shared grid, from the first step",
          "≈2× (whole run and step 1)", "kl_ratio_first_step", "all", "other-grid", paper_ratio=2.0,
          direction="higher", models="moe"),
    Claim("e", "without a quantized KV cache, BF16 end to end is 2.5–10× more consistent",
          "KL(all) / KL(bf16-e2e) = 2.5–10", "kl_ratio", "bf16-e2e", "all", paper_range=(2.5, 10.0),
          direction="higher",
          note="measured as KL(all) / KL(bf16-e2e): `all` is the most consistent FP8 pipeline (every sampler layer "
               "on the learner's grid), so this is the smallest factor the statement can mean; 'more consistent' = "
               "lower train–rollout KL"),
    Claim("f1", "MXFP8 training adds a fixed cost per micro-batch", "Δfixed > 0 per micro-batch", "cost_fixed",
          direction="higher"),
    Claim("f2", "MXFP8 saves a per-token cost; dense break-even ≈ 4.5k tokens per micro-batch",
          "break-even ≈ 4500 tokens per micro-batch", "cost_break_even", paper_ratio=4500.0),
    Claim("g", "a trace shows the GPU waiting for the host for most of the added time",
          "host-bound idle > 50% of the added wall time", "trace"),
    Claim("h1", "end-to-end MXFP8 cut MoE step time by 10.7%", "10.7% lower (ratio 0.893)", "time_ratio",
          "bf16-e2e", "all", metric="step_s", paper_ratio=0.893, direction="lower", models="moe"),
    Claim("h2", "end-to-end MXFP8 cut MoE generation time by 24%", "24% lower (ratio 0.76)", "time_ratio",
          "bf16-e2e", "all", metric="generate_s", paper_ratio=0.76, direction="lower", models="moe"),
    Claim("h3", "end-to-end MXFP8 slowed a short-sequence dense run by 5%", "5% higher (ratio 1.05)", "time_ratio",
          "bf16-e2e", "all", metric="step_s", paper_ratio=1.05, direction="higher", models="dense"),
)


def measure_label(metric: str) -> str:
    """A KL measure's name in words: ``"exact probe KL"`` for ``probe_kl``, ``"sampled-token k3"`` for
    ``k3`` (:data:`MEASURE_LABELS`)."""
    return MEASURE_LABELS.get(metric, f"sampled-token {metric}")


def claims_table(claims: tuple[Claim, ...] = CLAIMS) -> str:
    """:data:`CLAIMS` as a reStructuredText simple table: id, statement, the paper's number, what a sweep
    needs to test it."""
    rows = [(c.id, c.text, c.paper, c.needs) for c in claims]
    head = ("id", "statement", "paper", "needs")
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    rule = " ".join("=" * w for w in widths)
    line = lambda r: " ".join(f"{v:<{w}}" for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([rule, line(head), rule, *map(line, rows), rule])
