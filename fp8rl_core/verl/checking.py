"""W1–W7 after every weight sync of a verl run, on the live vLLM engine verl's server runs.

The same :class:`~fp8rl_core.checks.runner.CheckRunner` as the native loop (cadence, tiers, the seven
conditions; docs/correctness.md), with its two sides built from what a verl run has:

- the **learner** side from the weights verl's trainer hands the rollout adapter at the sync (its fp32
  masters by checkpoint name): loaded into the model of the run's checkpoint directory and put on the grid
  with the run's recipe (:func:`synced_learner`) — the expectation is derived from the learner's weights,
  never from what the adapter sent;
- the **sampler** side is :class:`ServerSampler`: the sampler seam (:class:`~fp8rl_core.sampler.seam.Sampler`)
  on verl's vLLM server (``Fp8rlHttpServer``) and its workers, with the native vLLM engine's snapshot,
  read-back, per-rank and probe operations, instead of an engine fp8rl started.

The adapter of rollout rank 0 of each replica runs them after every sync (:class:`SyncChecks`; the sync of
step k also feeds step k's train–rollout numbers, captured in the trainer, to the behavioural alarm) with the
run's ``checks`` section from its payload (:mod:`fp8rl_core.verl.payload`) — with ``checks.engine_checksums``
also vLLM's own weight checksums against the learner's bytes — appends each report to the JSON-lines file the
payload names (the launcher logs them to the run's MLflow record) and, under ``checks.on_failure: fail``,
raises :class:`CheckFailedError` naming the condition, the rank and the layer — verl's trainer stops and the
run ends FAILED with that line.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sampler.seam import Rollout, Sampler, SyncTiming, engine_config
from fp8rl_core.sampler.vllm.engine import VllmWorkers
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks
from fp8rl_core.sync.ranks import RankCheck
from fp8rl_core.vocabulary import ENGINE_CHECKSUM

if TYPE_CHECKING:
    from fp8rl_core.learner.config import LearnerConfig
    from fp8rl_core.verl.payload import VerlPayload

__all__ = ["CheckFailedError", "FaultVerdict", "ServerSampler", "SyncChecks", "alarm_verdict", "failed_results",
           "fault_verdict", "read_reports", "sync_results", "synced_learner"]


class CheckFailedError(RuntimeError):
    """A sync's checks failed under ``checks.on_failure: fail``."""


class ServerSampler(Sampler):
    """The sampler seam on verl's vLLM server (``server``: its Ray actor handle, a
    :class:`fp8rl_core.verl.rollout.Fp8rlHttpServer`): the same vLLM operations as the native engine
    (:class:`~fp8rl_core.sampler.vllm.engine.VllmWorkers`), with itself as their channel — worker RPCs
    through the server's ``collective_rpc`` (every rank answers), engine-core utilities and generation
    through its ``fp8rl_utility`` / ``fp8rl_generate``. Starts and stops nothing: the engine is verl's
    (``startup_s`` 0, ``close`` a no-op, ``alive`` while verl runs it)."""

    def __init__(self, server: Any, model_dir: str | Path, schemes: dict[str, str], mx_grid: str,
                 work_root: str | Path, instance: str, cfg: SamplerConfig = SamplerConfig()) -> None:
        self.server = server
        self.cfg, self.schemes, self.mx_grid = cfg, dict(schemes), mx_grid
        self.workers = VllmWorkers(self, engine_config(model_dir, schemes, mx_grid), work_root)
        self.workers.work_root.mkdir(parents=True, exist_ok=True)
        self.in_process, self.key, self.startup_s = False, "verl", 0.0
        self.version, self.syncs, self.instance = 0, 0, instance

    # -- the channel VllmWorkers calls through (VllmChannel) ----------------------------------------------
    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref)

    def rpc(self, method: str, *args) -> list:
        return self._get(self.server.collective_rpc.remote(method, args=args))

    def utility(self, method: str, *args):
        return self._get(self.server.fp8rl_utility.remote(method, *args))

    def outputs(self, what: str, prompts: list, params) -> list:
        """One ``fp8rl_generate`` for one ``params``; one per prompt, all in flight at once, for a list."""
        if isinstance(params, list):
            return [out for outs in self._get([self.server.fp8rl_generate.remote([p], q)
                                               for p, q in zip(prompts, params)]) for out in outs]
        return self._get(self.server.fp8rl_generate.remote(prompts, params))

    def reset_prefix_cache(self) -> bool:
        return bool(self.utility("reset_prefix_cache"))

    # -- the seam -----------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return True

    def engine_version(self) -> list[int]:
        return self.workers.engine_version()

    def layers(self) -> dict[str, dict]:
        return self.workers.layers()

    def prefix_cache_blocks(self) -> int:
        return self.workers.prefix_cache_blocks()

    def sync(self, tensors: Mapping[str, torch.Tensor], version: int, *, export_s: float = 0.0,
             hooks: SyncHooks = NO_HOOKS) -> SyncTiming:
        """fp8rl's own sync into verl's engine (files plus ``fp8rl_load``); verl's trainer syncs through
        :class:`~fp8rl_core.verl.rollout.Fp8rlServerAdapter` instead."""
        timing = self.workers.sync(tensors, version, self.cfg.bucket_mb, export_s=export_s, hooks=hooks)
        self.version = version
        self.syncs += 1
        return timing

    def state(self, *, fingerprints: bool = True) -> dict:
        return self.workers.state(self.instance, fingerprints=fingerprints)

    def read_back(self, names: Sequence[str] | None = None, *, effective: bool = False) -> dict[str, torch.Tensor]:
        return self.workers.read_back(names, effective=effective)

    def compute_check(self, *, full: bool = False) -> list[dict]:
        return self.workers.compute_check(full=full)

    def engine_checksums(self) -> dict[str, str] | None:
        return self.workers.engine_checksums()

    def check_ranks(self, expected: Mapping[str, torch.Tensor], *, full: bool = False) -> list[RankCheck]:
        return self.workers.check_ranks(expected, self.version, full=full)

    def generate(self, prompt_ids: torch.Tensor, n: int, max_tokens: int, *, seed: int, eos_id: int,
                 pad_id: int = 0, temperature: float | None = None, prompt_mask: torch.Tensor | None = None) -> Rollout:
        return self.workers.generate(prompt_ids, n, max_tokens, seed=seed, eos_id=eos_id, pad_id=pad_id,
                                     temperature=self.cfg.temperature if temperature is None else temperature,
                                     version=self.version, prompt_mask=prompt_mask)

    def prompt_logprobs(self, sequences: torch.Tensor, *, full: bool = False) -> torch.Tensor:
        return self.workers.prompt_logprobs(sequences, full=full)

    def close(self) -> None:
        pass


def synced_learner(masters: dict[str, torch.Tensor], model_dir: str | Path, version: int, config: "LearnerConfig"):
    """The learner as the sync found it: a :class:`~fp8rl_core.learner.learner.Learner` on the model of
    ``model_dir`` with ``masters`` (checkpoint names, fp32) as its weights, on the grid by the run's learner
    ``config``, at ``version``."""
    from safetensors.torch import save_file

    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.learner.warmstart import load_policy

    with tempfile.TemporaryDirectory(prefix="fp8rl-synced-") as tmp:
        shutil.copy(Path(model_dir) / "config.json", tmp)
        save_file({n: t.detach().float().contiguous() for n, t in masters.items()}, str(Path(tmp) / "model.safetensors"))
        model = load_policy(tmp)
    learner = Learner(model, config)
    learner.version = int(version)
    return learner


class SyncChecks:
    """The checks of one rollout replica across a run's syncs (module docstring), by the run's ``payload``."""

    def __init__(self, sampler: ServerSampler, payload: "VerlPayload", model_dir: str | Path) -> None:
        from fp8rl_core.checks import CheckRunner

        self.sampler, self.payload, self.model_dir = sampler, payload, Path(model_dir)
        self.reports = Path(payload.reports) if payload.reports else None
        self.learner_config = payload.learner_config()
        probe = torch.tensor(payload.probe, dtype=torch.long) if payload.probe else None
        self.runner = CheckRunner(payload.check_policy(), probe)
        self.started = False

    def before_sync(self) -> None:
        """Record the engine's starting state (post-load counts, cache resets) before its first sync."""
        if not self.started:
            self.runner.start([self.sampler])
            self.started = True

    def after_sync(self, masters: dict[str, torch.Tensor], version: int):
        """Check the sync that made the engine hold ``masters`` at ``version``; returns the report. The alarm
        numbers of RL step ``version`` (its rollout came before this sync; written by the trainer's capture,
        :mod:`fp8rl_core.verl.capture`) are judged by the behavioural alarm (W7) at this sync."""
        from fp8rl_core.verl.capture import read_numbers

        learner = synced_learner(masters, self.model_dir, version, self.learner_config)
        self.sampler.version = int(version)
        pipe = SimpleNamespace(learner=learner, samplers=[self.sampler], configured=self.sampler.schemes)
        numbers = read_numbers(self.payload.tokens, version) if self.payload.tokens and version >= 1 else {}
        policy = self.runner.policy
        off = self.payload.hooks.checks_off(int(version))  # a planted fault's switches: this sync only
        if off:
            self.runner.policy = policy.model_copy(update={c: False for c in off})
        try:
            report = self.runner.check(pipe, mismatch=numbers, step=int(version))
        finally:
            self.runner.policy = policy
        vck = self.engine_checksums(pipe, report)
        if self.reports is not None:
            self.reports.parent.mkdir(parents=True, exist_ok=True)
            with open(self.reports, "a") as f:
                f.write(json.dumps(report.as_dict() | {ENGINE_CHECKSUM: None if vck is None else vck.as_dict()}) + "\n")
        failed = [r.condition for r in report.failed] + ([ENGINE_CHECKSUM] if vck is not None and not vck.passed else [])
        if failed and (self.payload.hooks.on_failure(int(version)) or self.payload.checks.on_failure) == "fail":
            extra = [] if vck is None or vck.passed else [f"{ENGINE_CHECKSUM} failed: {vck.count} offenders, e.g. "
                                                          f"{vck.offenders[:3]} ({vck.detail})"]
            raise CheckFailedError(f"fp8rl checks failed at weight sync {report.sync} (version {report.version}): "
                                   + "; ".join([m for m in [report.message()] if m] + extra))
        return report

    def engine_checksums(self, pipe, report):
        """With ``checks.engine_checksums``: vLLM's own weight checksums of every rank against the digests of the
        learner's bytes at this sync, as the native correctness stage asks them
        (:func:`fp8rl_core.correctness.engine_checksums`); else, or where no expectation was derived, ``None``
        (not run)."""
        if not self.payload.checks.engine_checksums:
            return None
        from fp8rl_core.correctness import engine_checksums

        return engine_checksums(pipe, report)


def read_reports(path: str | Path) -> list[dict]:
    """The check reports a verl run appended to ``path`` (its payload's ``reports``), in sync order."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sync_results(report: dict) -> list[dict]:
    """One sync's check ``report``'s results: the conditions' and, where it ran, the engine's checksums'."""
    return report["results"] + [r for r in [report.get(ENGINE_CHECKSUM)] if r]


def failed_results(report: dict, after_fault: bool = False) -> list[dict]:
    """The failed results of one sync's check ``report``. ``after_fault``: the sync after one with a planted
    fault, whose rollouts ran on the faulted weights — the behavioural alarm's verdict on them (W7 offenders
    ``step …``, :mod:`fp8rl_core.checks.alarm`) is that fault seen in its rollouts, not a failure of this sync;
    any other offender (the probe's, another condition's) still counts."""
    def alarm_only(r: dict) -> bool:
        return r["condition"] == "W7" and all(str(o).startswith("step ") for o in r.get("offenders", []))

    return [r for r in sync_results(report) if not r["passed"] and not (after_fault and alarm_only(r))]


@dataclass(frozen=True)
class FaultVerdict:
    """How a planted fault showed in a verl run's check reports (:func:`fault_verdict`)."""

    fault: str
    condition: str
    rank: int | None
    caught_first: bool  #: its condition's check failed at its first sync (naming the rank, when planted on one)
    fired: tuple[str, ...]  #: the conditions whose checks failed at that sync
    named_rank: bool  #: the failing check's offenders name the planted rank (True when planted on every rank)
    offenders: tuple[str, ...]
    version: int | None = None  #: the version of the sync it was planted at (None: the run's first sync)
    repaired: bool | None = None  #: every check passed again at the next sync (None: no next sync)

    def as_row(self) -> dict:
        return {"fault": self.fault, "condition": self.condition, "rank": -1 if self.rank is None else self.rank,
                "version": -1 if self.version is None else self.version, "caught_first": self.caught_first,
                "fired": ",".join(self.fired), "named_rank": self.named_rank, "offenders": "; ".join(self.offenders[:3]),
                "repaired": self.repaired}


def fault_verdict(reports: list[dict], fault: str, condition: str, rank: int | None = None,
                  version: int | None = None) -> FaultVerdict:
    """Whether the fault ``fault`` (breaking ``condition``) planted on tensor-parallel rank ``rank`` (None:
    every rank) at the sync of ``version`` (None: from the first sync on) was caught at that sync of the run
    whose check ``reports`` (:func:`read_reports`) these are: the condition's check failed there and, for a
    one-rank fault, its offenders name that rank. A fault planted at one sync is repaired when every check
    of the next sync passes (the alarm on the faulted version's rollouts aside: :func:`failed_results`)."""
    at = 0 if version is None else next((i for i, r in enumerate(reports) if r["version"] == version), len(reports))
    first = reports[at] if at < len(reports) else {"results": []}
    failed = [r for r in sync_results(first) if not r["passed"]]
    fired = tuple(sorted({r["condition"] for r in failed}))
    offenders = tuple(o for r in failed if r["condition"] == condition for o in r.get("offenders", []))
    named = rank is None or any(rank in r.get("failing_ranks", ()) for r in failed if r["condition"] == condition)
    repaired = None
    if version is not None and at + 1 < len(reports):
        repaired = not failed_results(reports[at + 1], after_fault=True)
    return FaultVerdict(fault, condition, rank, condition in fired and named, fired, named, offenders, version, repaired)


def alarm_verdict(reports: list[dict], fault: str, version: int, rank: int | None = None) -> FaultVerdict:
    """Whether the fault ``fault`` planted at the sync of ``version`` with the compute-copy check off there
    (:attr:`~fp8rl_core.verl.payload.PlantedFault.checks_off`) was caught by W7, the engine's behaviour: its
    probe batch at that sync (a full-tier sync), or the behavioural alarm at the next sync — the sync of the
    first step whose rollouts ran on it: a W7 offender ``step <version+1>: …`` (:mod:`fp8rl_core.checks.alarm`).
    ``fired``: the conditions failing at the plant's own sync; ``offenders``: the alarm's, else the probe's;
    ``named_rank``: False (W7 judges the engine's output, not a rank); ``repaired``: nothing but that alarm
    failed at the next sync (:func:`failed_results`)."""
    at = next((i for i, r in enumerate(reports) if r["version"] == version), len(reports))
    plant = reports[at] if at < len(reports) else {"results": []}
    after = reports[at + 1] if at + 1 < len(reports) else None
    fired = tuple(sorted({r["condition"] for r in sync_results(plant) if not r["passed"]}))
    alarm = tuple(str(o) for r in (after or {"results": []})["results"] if r["condition"] == "W7" and not r["passed"]
                  for o in r.get("offenders", []) if str(o).startswith(f"step {version + 1}: "))
    probe = tuple(str(o) for r in plant["results"] if r["condition"] == "W7" and not r["passed"]
                  for o in r.get("offenders", []) if not str(o).startswith("step "))
    repaired = None if after is None else not failed_results(after, after_fault=True)
    return FaultVerdict(fault, "W7", rank, bool(alarm or probe), fired, False, alarm or probe, version, repaired)
