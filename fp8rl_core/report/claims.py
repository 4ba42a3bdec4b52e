"""The paper's claims as data: :data:`CLAIMS` holds each statement of docs/design.md ("Reference results":
dense Qwen3-8B, MoE Qwen3-30B-A3B, B200, single seed) with its number, how it is measured (its kind, one
of :data:`CLAIM_KINDS`, checked when a :class:`Claim` is made) and what a sweep must contain to test it.
:func:`claims_table` renders them as a table (for docs and reports); :mod:`fp8rl_core.report.verdicts`
measures each on a sweep and gives its verdict (docs/metrics.md, "Claims and verdicts").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from fp8rl_core.metrics.power import SampleNeeded
from fp8rl_core.metrics.stats import ci_side
from fp8rl_core.sampler.presets import PRESETS

__all__ = ["CLAIMS", "CLAIM_KINDS", "KL_KINDS", "MEASURE_LABELS", "PROBE_MEASURE", "VERDICTS", "Claim", "ClaimKind",
           "Direction", "ModelClass", "Verdict", "claim_verdict", "claims_table", "joint_verdict", "measure_label",
           "needed_text"]

#: the primary KL measure of the KL claims when the sweep has a probe table (a report metric name)
PROBE_MEASURE = "probe_kl"
#: a KL measure's name in a claim row's text (``"… — exact probe KL"``); other metrics: "sampled-token <metric>"
MEASURE_LABELS = {"probe_kl": "exact probe KL", "probe_kl_rev": "exact probe KL(learner‖sampler)",
                  "probe_js": "exact probe JS"}

#: a claim's verdict on a sweep: what the data can say (:func:`claim_verdict`), or that this setup cannot
#: measure it
Verdict = Literal["reproduced", "contradicted", "unresolved", "not measurable here"]
VERDICTS: tuple[str, ...] = get_args(Verdict)

#: how a claim is measured (:class:`Claim`); each has one evaluator in :mod:`fp8rl_core.report.verdicts`
ClaimKind = Literal["kl_ratio", "kl_ratio_first_step", "sync", "cost_fixed", "cost_break_even", "trace", "time_ratio"]
CLAIM_KINDS: tuple[str, ...] = get_args(ClaimKind)
#: the kinds measured as a KL ratio of two presets (the claims with exact probe rows, power and factors)
KL_KINDS: tuple[ClaimKind, ...] = ("kl_ratio", "kl_ratio_first_step")
#: the side of 1 (of 0 for a difference) a claim says its measure lies on
Direction = Literal["lower", "higher"]
#: which models of a sweep a claim is about
ModelClass = Literal["any", "dense", "moe"]


@dataclass(frozen=True)
class Claim:
    """One statement of the paper.

    ``kind`` (one of :data:`CLAIM_KINDS`) says how it is measured: ``kl_ratio`` (KL of ``candidate`` /
    KL of ``baseline``), ``kl_ratio_first_step`` (the same, whole run and step 1), ``sync`` (the W2 rows of the syncs on the learner's grid),
    ``cost_fixed`` / ``cost_break_even`` (the micro-batch cost model), ``trace`` (GPU idle analysis),
    ``time_ratio`` (``metric`` = a steps-table time column, candidate / baseline). ``paper_ratio`` /
    ``paper_range``: the paper's number, ``direction``: ``"lower"`` or ``"higher"`` (the claimed side of
    1), ``models``: which models it is about (``"any"``, ``"dense"``, ``"moe"``), ``note``: why the
    comparison is set up this way, when that is a choice. An unknown kind, direction or models value
    raises ValueError naming the claim, the value and the valid ones."""

    id: str
    text: str
    paper: str
    kind: ClaimKind
    baseline: str | None = None
    candidate: str | None = None
    metric: str = "k3"
    paper_ratio: float | None = None
    paper_range: tuple[float, float] | None = None
    direction: Direction | None = None
    models: ModelClass = "any"
    note: str = ""
    #: a comparison of two presets in a few words, and the paper's number in fewer (the fixed-weights report's rows)
    short: str = ""
    paper_short: str = ""

    def __post_init__(self) -> None:
        for field, value, valid in (("kind", self.kind, CLAIM_KINDS),
                                    ("direction", self.direction, (*get_args(Direction), None)),
                                    ("models", self.models, get_args(ModelClass))):
            if value not in valid:
                raise ValueError(f"claim {self.id!r}: unknown {field} {value!r}; valid: "
                                 + ", ".join(repr(v) for v in valid))

    @property
    def needs(self) -> str:
        """What a sweep must contain for this claim, in words."""
        if self.kind in (*KL_KINDS, "time_ratio"):
            model = {"any": "", "dense": "a dense model, ", "moe": "a MoE model, "}[self.models]
            table = "their tokens table" if self.kind != "time_ratio" else "a steps table or run time metrics"
            return f"{model}presets {self.candidate} and {self.baseline} with {table}"
        return _NEEDS[self.kind]


#: what a sweep needs for a claim of a kind that is not a comparison of two presets
_NEEDS: dict[str, str] = {"sync": "W2 checks of runs whose sampler holds layers on the learner's grid (presets "
                                  + ", ".join(p.name for p in PRESETS.values() if p.scheme.on_learner_grid) + ")",
                          "cost_fixed": "micro-batch timings of a BF16 and an MXFP8 learner",
                          "cost_break_even": "micro-batch timings of a BF16 and an MXFP8 learner",
                          "trace": "a GPU profiler trace of each precision"}

CLAIMS: tuple[Claim, ...] = (
    Claim("a", "half-on-grid sampler: KL 11% lower than a BF16 sampler (MXFP8 learner)", "11% lower (ratio 0.89)",
          "kl_ratio", "bf16-sampler", "half", paper_ratio=0.89, direction="lower",
          short="half on the learner's grid vs BF16 sampler", paper_short="−11%"),
    Claim("b", "all-on-grid sampler: KL 16% lower than a BF16 sampler (MXFP8 learner)", "16% lower (ratio 0.84)",
          "kl_ratio", "bf16-sampler", "all", paper_ratio=0.84, direction="lower",
          short="all on the learner's grid vs BF16 sampler", paper_short="−16%"),
    Claim("c", "synced weights equal the learner's FP8 forward weights byte for byte", "byte for byte at every sync",
          "sync"),
    Claim("d", "MoE: a sampler on another FP8 grid has ≈2× the KL of the shared grid, from the first step",
          "≈2× (whole run and step 1)", "kl_ratio_first_step", "all", "other-grid", paper_ratio=2.0,
          direction="higher", models="moe", short="another FP8 grid (128×128 blocks) vs the learner's", paper_short="≈2×"),
    Claim("e", "without a quantized KV cache, BF16 end to end is 2.5–10× more consistent",
          "KL(all) / KL(bf16-e2e) = 2.5–10", "kl_ratio", "bf16-e2e", "all", paper_range=(2.5, 10.0),
          direction="higher",
          note="measured as KL(all) / KL(bf16-e2e): `all` is the most consistent FP8 pipeline (every sampler layer "
               "on the learner's grid), so this is the smallest factor the statement can mean; 'more consistent' = "
               "lower train–rollout KL", short="all on the learner's grid vs BF16 end to end", paper_short="2.5–10×"),
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


def claim_verdict(lo: float, hi: float, direction: Direction, null: float = 1.0) -> Verdict:
    """The one verdict rule of every report (docs/metrics.md, "Verdict rules"), on a claim that a quantity lies
    ``direction`` of ``null`` (1 for a ratio, 0 for a difference) and its interval [lo, hi]: *reproduced*
    when the interval lies on the claimed side, *contradicted* when it lies on the other side, *unresolved*
    when it includes ``null`` (the data cannot tell; the report says what sample would:
    :func:`fp8rl_core.metrics.power.sample_needed`)."""
    if direction not in get_args(Direction):
        raise ValueError(f"direction must be 'lower' or 'higher', got {direction!r}")
    side = ci_side(lo, hi, null)
    return "unresolved" if side == "unresolved" else "reproduced" if side == direction else "contradicted"


def joint_verdict(verdicts: Sequence[Verdict]) -> Verdict:
    """The verdict of a claim that needs several intervals at once (e.g. (d): whole run and step 1): reproduced
    when every one is, contradicted when any one is, else unresolved."""
    if not verdicts:
        raise ValueError("joint_verdict of no verdicts")
    if all(v == "reproduced" for v in verdicts):
        return "reproduced"
    return "contradicted" if "contradicted" in verdicts else "unresolved"


def needed_text(n: SampleNeeded, target: str, groups: str = "seeds", units: str = "sequences") -> str:
    """What an *unresolved* verdict adds: the sample a resolution of ``target`` (its words, e.g. "the paper's
    0.89") would need by :func:`~fp8rl_core.metrics.power.sample_needed` — ``groups`` (seeds, checkpoints) ×
    ``units`` each, the range σ²_between's own uncertainty allows, the floor however many units — or that
    this design already had the power."""
    pw = f"{n.power:.0%} power"
    if n.groups is None:
        one = groups[:-1] if groups.endswith("s") else groups
        return (f"a resolution of {target} at {pw} needs at least {n.units} {units} (one {one}: the spread "
                f"between {groups} is unknown, so more {groups} may be needed)")
    if n.enough:
        return (f"this design ({n.have} {groups} × {n.per_group} {units}) had {pw} for {target} "
                f"({n.groups} {groups if n.groups != 1 else groups.removesuffix('s')} needed)")
    if n.groups_range is None:
        extra = [f"σ²_between rests on {n.have} {groups} only"]
    else:
        lo, hi = n.groups_range
        extra = [f"{lo}–{hi} over σ²_between's {n.spread_level:.0%} interval"] if lo != hi else []
    if n.floor is not None and n.floor > 1:
        extra.append(f"at least {n.floor} however many {units}")
    extra.append(f"this design: {n.have}")
    return (f"a resolution of {target} at {pw} needs {n.groups} {groups} × {n.per_group} {units} "
            f"({'; '.join(extra)})")


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
