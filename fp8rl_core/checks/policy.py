"""The check policy: the run config's ``checks`` section and what the check runner reads, one frozen pydantic
model (``extra="forbid"``) — :class:`CheckPolicy`.

Rule: the cheap tier runs after every sync, the full tier every ``full_every`` syncs (and at an engine's first
sync, and on suspicion — a cheap check failed or the behavioural alarm suspects the step:
:func:`fp8rl_core.checks.runner.full_tier_reason`); a sync may depart from the policy for itself alone
(:class:`SyncPlan`); W7's bound is the run's own where set,
else by the engine's dtype and the sampler's scheme (:meth:`CheckPolicy.w7_bounds`). Every field, with its
default: docs/configs.md (checks); what each condition checks: docs/correctness.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fp8rl_core.grids.schemes import BF16, Scheme

__all__ = ["CheckPolicy", "SyncPlan", "W7_COARSE", "W7_COARSE_MIN_PROB", "W7_EXACT"]

#: W7's (mean, max) bound on |Δlogp| where the engine runs the learner's arithmetic: a float32 engine on the
#: learner's bytes or BF16 views (measured mean ≤ 1e-4 on the learner's grid)
W7_EXACT = (1e-3, 0.05)
#: W7's bound where the engine adds its own rounding: a BF16 engine (BF16 activations and accumulation; measured
#: on the peaked smoke mini, preset all: mean 0.09, max 0.79), or a scheme whose rounding the learner's probe
#: does not model (``requant``, ``block128``: there W7 is a coarse backstop; the exact check is a float32 engine)
W7_COARSE = (0.5, 8.0)
#: the probability below which a probe position says nothing of an engine that adds its own rounding: where both
#: the learner and the engine give the probe token less than this, a BF16 engine's |Δlogp| is the rounding of two
#: negligible probabilities (measured: dense mini, preset half, seed 1, 40 RL steps of the clean-long sweep — the
#: probe's max |Δlogp| 8.35 at log p −34.2 vs −25.8; over the positions where either side gives ≥ 1e-3: max 0.68,
#: mean 0.077), and the coarse probe judges the others (docs/correctness.md, W7)
W7_COARSE_MIN_PROB = 1e-3


class CheckPolicy(BaseModel):
    """The weight-sync checks after every sync (:class:`fp8rl_core.checks.runner.CheckRunner`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    full_every: int = Field(10, ge=1, description="full tier every N syncs (and at an engine's first sync, and on suspicion)")
    on_failure: Literal["fail", "warn"] = Field("fail", description="fail: a failed check fails the run; warn: log it and go on")
    probe_sequences: int = Field(8, ge=1, description="W7 probe batch: held-out task sequences")
    w7_mean: float | None = Field(None, gt=0, description="W7 bound on mean |Δlogp| (None: by engine dtype and preset)")
    w7_max: float | None = Field(None, gt=0, description="W7 bound on max |Δlogp| (None: by engine dtype and preset)")
    w7_verdict: Literal["fail", "event"] | None = Field(None, description="what W7's probe above its bound does when "
                                                        "every exact check passes: fail the sync, or record a mismatch "
                                                        "event (None: by engine dtype and preset — fail where the engine "
                                                        "runs the learner's arithmetic, event where it adds its own "
                                                        "rounding)")
    w7_min_prob: float | None = Field(None, ge=0, lt=1, description="W7's probe judges the positions where the learner "
                                      "or the engine gives the probe token at least this probability (None: by engine "
                                      "dtype and preset — 0, every position, where the engine runs the learner's "
                                      "arithmetic; 1e-3 where it adds its own rounding)")
    compute_copy: bool = Field(True, description="W6: every rank's compute copy against its held bytes")
    alarm: bool = Field(True, description="W7: the behavioural alarm on the run's per-step mismatch numbers (a suspect "
                        "step runs the full tier, which confirms a fault or records a mismatch event)")
    alarm_jump: float = Field(10.0, gt=1, description="a step is suspect at this factor over the run's median of earlier "
                              "clean steps (its absolute bounds: docs/correctness.md)")
    alarm_warmup: int = Field(2, ge=0, description="clean steps before the alarm's jump can fire")
    engine_checksums: bool = Field(False, description="backend verl: at every sync also the engine's own weight "
                                   "checksums (vLLM's weight checker) against the learner's bytes, a second opinion on "
                                   "W2/W4 (SHA-256 of every parameter; the native correctness stage always asks; a "
                                   "native experiment run refuses it)")
    layout_tolerance: float = Field(0.25, gt=0, description="W3: a slot holds a member when it is within this "
                                    "fraction of the block amax of the member's master")
    history: int = Field(4, ge=1, description="learner versions whose fingerprints are kept (W5 content)")

    def w7_bounds(self, dtype: str = "float32", scheme: Scheme = BF16) -> tuple[float, float]:
        """W7's (mean, max) bound: the run's own where set, else :data:`W7_EXACT` for a ``float32`` engine on a
        scheme whose rounding the learner's probe models (:attr:`Scheme.probe_exact`), :data:`W7_COARSE` otherwise."""
        mean, mx = W7_EXACT if dtype == "float32" and scheme.probe_exact else W7_COARSE
        return self.w7_mean or mean, self.w7_max or mx

    def w7_positions(self, dtype: str = "float32", scheme: Scheme = BF16) -> float:
        """The least probability (on either side) of a probe position W7 judges: the run's own where set, else 0
        (every position) where :meth:`w7_bounds` is exact, :data:`W7_COARSE_MIN_PROB` where it is coarse."""
        if self.w7_min_prob is not None:
            return self.w7_min_prob
        return 0.0 if dtype == "float32" and scheme.probe_exact else W7_COARSE_MIN_PROB

    def w7_on_failure(self, dtype: str = "float32", scheme: Scheme = BF16) -> str:
        """What W7's probe above its bound does with every exact check passing: the run's own where set, else
        ``fail`` where :meth:`w7_bounds` is exact and ``event`` where it is coarse — an engine that adds its own
        rounding (BF16 activations) drifts from the learner's fp32 model of it as RL sharpens the policy (a clean
        40-step run's probe reached mean |Δlogp| 0.54 on the judged positions, docs/correctness.md), so there the
        probe is behavioural evidence like the alarm, and the exact checks decide."""
        if self.w7_verdict is not None:
            return self.w7_verdict
        return "fail" if dtype == "float32" and scheme.probe_exact else "event"

    def for_engine(self, dtype: str, preset: str) -> "CheckPolicy":
        """This policy with W7's bound, positions and verdict resolved for an engine of ``dtype`` serving
        ``preset``'s sampler."""
        from fp8rl_core.sampler.presets import PRESETS

        s = PRESETS[preset].scheme
        mean, mx = self.w7_bounds(dtype, s)
        return self.model_copy(update={"w7_mean": mean, "w7_max": mx, "w7_min_prob": self.w7_positions(dtype, s),
                                       "w7_verdict": self.w7_on_failure(dtype, s)})


#: the policy's switches a :class:`SyncPlan` may turn off at one sync
SWITCHES = ("compute_copy", "alarm")


@dataclass(frozen=True)
class SyncPlan:
    """What one sync's checks do beside the run's :class:`CheckPolicy`, for that sync only (the runner reads it;
    nothing is mutated): the fault series sets these per planted fault, the native correctness stage asks the
    engine's checksums at every sync."""

    #: policy switches off at this sync (of :data:`SWITCHES`): a planted fault left to another check
    off: frozenset[str] = frozenset()
    #: the cadence set aside: the full tier runs only where it must (first sync, a new engine) or on suspicion
    cheap_only: bool = False
    #: ``fail``/``warn`` at this sync instead of the policy's ``on_failure`` (None: the policy's)
    on_failure: Literal["fail", "warn"] | None = None
    #: the engine's own weight checksums at this sync (None: the policy's ``engine_checksums``)
    engine_checksums: bool | None = None

    def __post_init__(self) -> None:
        unknown = set(self.off) - set(SWITCHES)
        if unknown:
            raise ValueError(f"sync plan: {sorted(unknown)} cannot be switched off at one sync; valid: {', '.join(SWITCHES)}")
