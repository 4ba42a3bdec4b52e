"""What the nightly correctness stage's series is, and how it is judged (docs/correctness.md): the plan (which
faults, in which order, at which sync versions, on which pipeline), the verdicts on what ran, the metrics the
stage's MLflow run ``correctness`` logs and the error that fails it. Pure: the flows
(:mod:`flows.native_correctness`, :mod:`flows.verl_correctness`) compose the tasks that run the plan and log
what this module computes.

- **Native** (``backend: native``, fp8rl's own loop): per model, ``clean_syncs`` clean syncs, then every
  wanted fault of that model (:func:`native_series`), the ones on the shared pipeline before the ones that
  need a pipeline of their own; each judged at its first sync (:func:`fp8rl_core.correctness.inject`); the
  stage fails when a fault was not caught there or a clean sync raised an alarm (:func:`native_verdict`).
- **Through verl's trainer** (``backend: verl``): one verl run per model, the **fault series**
  (:func:`verl_series`): ``clean_syncs`` clean syncs, the blind plants (checks switched off at their sync, left
  to W7), every worker fault at a sync of its own with a clean sync after it, last the first fault again under
  ``on_failure: fail``, which must stop verl. :meth:`VerlSeries.judge` reads the run's check reports with
  :mod:`fp8rl_core.verl.verdicts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fp8rl_core.checks import matrix as fault_matrix
from fp8rl_core.checks.faults import FAULTS, Fault
from fp8rl_core.config.runs import Run
from fp8rl_core.config.schema import RunConfig
from fp8rl_core.config.sweep import CorrectnessSection
from fp8rl_core.verl.payload import PlantedFault, VerlHooks
from fp8rl_core.verl.verdicts import FaultVerdict, alarm_verdict, failed_results, fault_verdict
from fp8rl_core.vocabulary import CONDITIONS, ENGINE_CHECKSUM

__all__ = ["NativeSeries", "Plant", "StageVerdict", "VerlOutcome", "VerlSeries", "native_metrics", "native_series",
           "native_verdict", "not_plantable", "verl_metrics", "verl_series", "verl_verdict", "wanted_faults"]


def wanted_faults(section: CorrectnessSection) -> list[Fault]:
    """The faults of the catalogue the section asks for (``faults``; None: all), in catalogue order."""
    return [f for f in FAULTS if section.faults is None or f.name in section.faults]


def not_plantable(wanted: Sequence[Fault]) -> list[str]:
    """The wanted faults verl's path cannot carry (only the worker's load, stages ``load`` / ``post-load``)."""
    return [f.name for f in wanted if f.worker is None]


@dataclass(frozen=True)
class StageVerdict:
    """The stage's verdict: the faults that were missed and the false alarms on clean syncs; :attr:`error` is
    the line the stage fails with (None: it passed)."""

    missed: tuple[str, ...]
    alarms: tuple[str, ...]
    error: str | None


# ------------------------------------------------------------------------------------------------ native
def own_pipeline(f: Fault) -> bool:
    """A fault with its own engine configuration or replicas runs on a pipeline of its own."""
    return f.replicas > 1 or f.engine_schemes is not None


@dataclass(frozen=True)
class NativeSeries:
    """One model's native series: ``clean_syncs`` clean syncs, then ``faults`` in order."""

    kind: str
    clean_syncs: int
    faults: tuple[Fault, ...]

    def key(self, run_id: str) -> str:
        """The live pipeline's key of the model's shared pipeline (its run id ``run_id``)."""
        return f"correctness-{self.kind}-{run_id}"

    def fault_key(self, key: str, f: Fault) -> str:
        """The pipeline fault ``f`` runs on: the shared one (``key``), or one of its own, set up for it."""
        return f"{key}-{f.name}" if own_pipeline(f) else key

    def clean_rows(self, rows: Sequence[dict]) -> list[dict]:
        """The clean series' rows with the model kind (the ``clean_syncs`` table)."""
        return [r | {"model": self.kind} for r in rows]

    def clean_line(self, rows: Sequence[dict]) -> str:
        return f"{self.kind}: {len(rows)} clean syncs, {sum(r['false_alarm'] for r in rows)} false alarms"

    @staticmethod
    def fault_line(f: Fault, row: Mapping) -> str:
        return (f"fault {f.name} ({f.condition}): caught at first sync: {row['caught_first']}; fired: "
                f"{[c for c in CONDITIONS if row.get(c)]}")


def native_series(section: CorrectnessSection, kinds: Iterable[str], wanted: Sequence[Fault]) -> list[NativeSeries]:
    """Each model's series (``kinds``: the models of the section's runs, in order): its clean syncs and the
    wanted faults declared on it — the faults on the shared pipeline first (a fault with its own engine
    configuration or replicas starts a pipeline that may take over, and resync, the shared engine)."""
    return [NativeSeries(kind, section.clean_syncs[kind],
                         tuple(sorted((f for f in wanted if f.model == kind), key=own_pipeline)))
            for kind in kinds]


def native_metrics(matrix: Sequence[dict], clean: Sequence[dict]) -> tuple[dict, dict[str, float]]:
    """The detection matrix's summary (:func:`fp8rl_core.checks.matrix.summarize`) and the metrics the
    ``correctness`` run logs from it: ``faults/…``, ``clean/…``, the clean series' mean ``time/checks_s`` and
    ``time/step_s`` (a step's ``total_s``, checks included) and ``time/checks_fraction`` (checks ÷ step),
    ``check/<W>/necessary``, and vLLM's own checksums (``vllm_checksum/clean_syncs``, ``…/clean_disagreements``,
    ``…/faults_fired``, ``time/vllm_checksum_s`` where they ran)."""
    summary = fault_matrix.summarize(list(matrix), list(clean))
    checks_s = [r["checks_s"] for r in clean]
    step_s = [r["step_s"] for r in clean]
    metrics = {k: float(v) for k, v in summary.items() if k.startswith(("faults/", "clean/"))}
    metrics |= {"time/checks_s": sum(checks_s) / len(checks_s), "time/step_s": sum(step_s) / len(step_s),
                "time/checks_fraction": sum(checks_s) / max(sum(step_s), 1e-9)}
    metrics |= {f"check/{c}/necessary": float(v["necessary"]) for c, v in summary["checks"].items()}
    second = summary[ENGINE_CHECKSUM]  # vLLM's own checksums: where they ran, disagreed, fired
    metrics |= {f"{ENGINE_CHECKSUM}/clean_syncs": float(second["clean_syncs_run"]),
                f"{ENGINE_CHECKSUM}/clean_disagreements": float(second["clean_disagreements"]),
                f"{ENGINE_CHECKSUM}/faults_fired": float(len(second["fired_on"]))}
    seconds = [r[f"{ENGINE_CHECKSUM}_s"] for r in clean if r.get(f"{ENGINE_CHECKSUM}_s") is not None]
    if seconds:
        metrics[f"time/{ENGINE_CHECKSUM}_s"] = sum(seconds) / len(seconds)
    return summary, metrics


def native_verdict(matrix: Sequence[dict], clean: Sequence[dict]) -> StageVerdict:
    """Missed: a fault not caught at its first sync by its condition's check; an alarm: a clean sync that failed."""
    missed = tuple(r["fault"] for r in matrix if not r["caught_first"])
    alarms = tuple(r["alarms"] for r in clean if r["false_alarm"])
    error = None
    if missed or alarms:
        error = (f"correctness: {len(missed)} faults not caught at their first sync by their condition's check "
                 f"({', '.join(missed) or 'none'}); {len(alarms)} false alarms on clean syncs"
                 + (f", e.g. {alarms[0]}" if alarms else ""))
    return StageVerdict(missed, alarms, error)


# -------------------------------------------------------------------------------------- through verl
@dataclass(frozen=True)
class Plant:
    """One fault planted at the sync of ``version`` of a verl run: on tensor-parallel rank ``rank`` (None: every
    rank), with ``checks_off`` switched off there (a blind plant), under ``on_failure`` (``fail``: the stop);
    ``cheap_tier``: its sync checked at the cheap tier only (a fault of ``cheap_faults``: the cheap tier must
    catch it on its own)."""

    fault: Fault
    version: int
    rank: int | None
    checks_off: tuple[str, ...] = ()
    on_failure: str | None = None
    cheap_tier: bool = False

    def hook(self) -> PlantedFault:
        return PlantedFault(name=self.fault.name, rank=self.rank, version=self.version, checks_off=self.checks_off,
                            on_failure=self.on_failure, cheap_tier=self.cheap_tier)


@dataclass(frozen=True)
class VerlOutcome:
    """What one model's fault series through verl showed: a row per plant (``verl_faults``) and for the stop,
    the false alarms (clean syncs that failed, or the run failing before its stop), the lines to log."""

    rows: tuple[dict, ...]
    stops: tuple[dict, ...]
    alarms: tuple[str, ...]
    lines: tuple[str, ...]


@dataclass(frozen=True)
class VerlSeries:
    """One model's fault series through verl's trainer (module docstring): ``plants`` in sync order, a clean sync
    after each, then ``stop`` (None when no fault of the model can travel through verl: ``steps`` clean steps)."""

    kind: str
    plants: tuple[Plant, ...]
    stop: Plant | None
    steps: int

    @property
    def hooks(self) -> VerlHooks:
        """The run's hooks: every plant, then the stop."""
        return VerlHooks(faults=tuple(p.hook() for p in (*self.plants, *([self.stop] if self.stop else []))))

    @property
    def planted_at(self) -> set[int]:
        return {p.version for p in self.plants} | ({self.stop.version} if self.stop else set())

    def config(self, cfg: RunConfig) -> RunConfig:
        """The model's correctness config for the series: ``steps`` steps, every sync at the full tier with vLLM's
        own checksums, ``on_failure: warn`` (verl goes on; the stop's own plant says ``fail``)."""
        return cfg.model_copy(update={"loop": cfg.loop.model_copy(update={"steps": self.steps}),
                                      "checks": cfg.checks.model_copy(update={
                                          "on_failure": "warn", "full_every": 1, "engine_checksums": True})})

    def run(self, base: Run) -> Run:
        """The series' run: the model's correctness run with :meth:`config`, its id and name marked ``faults``."""
        run = Run.of(self.config(base.config), base.spec)
        return dataclasses.replace(run, id=f"{run.id}-faults", name=f"{run.name}·faults")

    def judge(self, reports: Sequence[dict], failed: bool, reason: str | None, mlflow_run: str) -> VerlOutcome:
        """The series' verdicts from the run's check ``reports`` (:func:`fp8rl_core.verl.verdicts.read_reports`),
        whether the run ``failed`` and verl's ``reason``: each plant caught at its sync by its condition's check
        (naming its rank) — a blind plant by W7, there or at the next sync — and repaired at the next; the stop
        caught and verl stopped there by the check's error; a failed check at a sync without a plant (or after
        one, but the alarm on its rollouts) is a false alarm, as is the run failing before the stop's sync."""
        planted = self.planted_at
        alarms = [f"{self.kind} sync {r['sync']}: {c['condition']}" for r in reports if r["version"] not in planted
                  for c in failed_results(r, after_fault=r["version"] - 1 in planted)]
        last = reports[-1]["version"] if reports else None
        stop_at = self.stop.version if self.stop else None
        if failed and last != stop_at:
            alarms.append(f"{self.kind}: the fault series failed at sync version {last} ({mlflow_run}; its error "
                          "tag says why)")
        lines = [f"{self.kind}: {len(reports)} syncs through verl, {len(self.hooks.faults)} faults planted, "
                 f"{len(alarms)} false alarms"]
        rows, stops = [], []
        for p in self.plants:
            f, off = p.fault, p.checks_off
            v: FaultVerdict = (alarm_verdict(reports, f.name, p.version, p.rank) if off  # the alarm at the next sync
                               else fault_verdict(reports, f.name, f.condition, p.rank, version=p.version))
            where = ("" if p.rank is None else f", rank {p.rank}") + (f"; {', '.join(off)} off" if off else "")
            lines.append(f"fault {f.name} ({f.condition}{where}) at sync version {p.version}: caught "
                         f"{'by W7 (its probe there or the alarm at the next sync)' if off else 'there'}: "
                         f"{v.caught_first}; fired there: {list(v.fired)}; repaired: {v.repaired}")
            rows.append(v.as_row() | {"model": self.kind, "run": "series", "mlflow_run": mlflow_run,
                                      "checks_off": ",".join(off)})
        if self.stop is not None:  # the first fault again under on_failure: fail: verl must stop at its sync
            f = self.stop.fault
            v = fault_verdict(reports, f.name, f.condition, self.stop.rank, version=stop_at)
            stopped = failed and last == stop_at and "CheckFailedError" in (reason or "")
            lines.append(f"fault {f.name} at sync version {stop_at} under on_failure fail: caught there: "
                         f"{v.caught_first}; verl stopped there: {stopped}")
            stops.append(v.as_row() | {"model": self.kind, "run": "stop", "mlflow_run": mlflow_run, "stopped": stopped})
        return VerlOutcome(tuple(rows), tuple(stops), tuple(alarms), tuple(lines))


def verl_series(section: CorrectnessSection, kind: str, wanted: Sequence[Fault]) -> VerlSeries:
    """Model ``kind``'s fault series through verl from the section (``clean_syncs``, ``blind_faults``,
    ``fault_ranks``) and the ``wanted`` worker faults: those of the model — and the dense mini's, which act on the
    linear layers on the grid the MoE mini has too — the blind plants first, on the policy the warm start made
    (the others' rollouts train it on faulted weights), then every fault with its checks on, each at a sync of
    its own (``clean_syncs``, +2, …; a fault of ``cheap_faults`` checked at the cheap tier there), the stop at the
    series' last sync."""
    mine = [f for f in wanted if f.worker is not None and f.model in (kind, "dense")]
    planned = [(f, tuple(section.blind_faults[f.name])) for f in mine if f.name in section.blind_faults]
    planned += [(f, ()) for f in mine]
    clean = section.clean_syncs[kind]
    plants = tuple(Plant(f, clean + 2 * i, section.fault_ranks.get(f.name), off,
                         cheap_tier=not off and f.name in section.cheap_faults) for i, (f, off) in enumerate(planned))
    if not mine:
        return VerlSeries(kind, plants, None, max(1, clean - 1))
    stop_at = clean + 2 * len(plants)
    stop = Plant(mine[0], stop_at, section.fault_ranks.get(mine[0].name), on_failure="fail")
    return VerlSeries(kind, plants, stop, max(1, stop_at))


def verl_metrics(rows: Sequence[dict], alarms: Sequence[str]) -> dict[str, float]:
    """The ``correctness`` run's metrics of the series through verl: ``verl_faults/planted``, ``…/caught_first``,
    ``…/repaired``, ``…/false_alarms``."""
    return {"verl_faults/planted": float(len(rows)),
            "verl_faults/caught_first": float(sum(r["caught_first"] for r in rows)),
            "verl_faults/repaired": float(sum(bool(r["repaired"]) for r in rows)),
            "verl_faults/false_alarms": float(len(alarms))}


def verl_verdict(rows: Sequence[dict], stops: Sequence[dict], alarms: Sequence[str]) -> StageVerdict:
    """Missed: a plant not caught at its sync and repaired at the next, a stop that did not stop verl."""
    missed = [r["fault"] for r in rows if not (r["caught_first"] and r["repaired"])]
    missed += [f"{r['fault']} (did not stop verl)" for r in stops if not (r["caught_first"] and r["stopped"])]
    error = None
    if missed or alarms:
        error = (f"correctness through verl: {len(missed)} faults not caught at their sync by their "
                 f"condition's check and repaired at the next, or not stopping verl "
                 f"({', '.join(missed) or 'none'}); {len(alarms)} false alarms on clean syncs"
                 f"{', e.g. ' + alarms[0] if alarms else ''}")
    return StageVerdict(tuple(missed), tuple(alarms), error)
