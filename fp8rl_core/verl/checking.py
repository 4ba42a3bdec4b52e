"""W1–W7 after every weight sync of a verl run, on the live vLLM engine verl's server runs.

The same :class:`~fp8rl_core.checks.runner.CheckRunner` as the native loop (cadence, tiers, the seven
conditions; docs/correctness.md), with its two sides built from what a verl run has:

- the **learner** side from the weights verl's trainer hands the rollout adapter at the sync (its fp32
  masters by checkpoint name): loaded into the model of the run's checkpoint directory and put on the grid
  with the run's recipe (:func:`synced_learner`) — the expectation is derived from the learner's weights,
  never from what the adapter sent;
- the **sampler** side is :class:`~fp8rl_core.verl.server_sampler.ServerSampler`: the sampler seam on verl's
  vLLM server (``Fp8rlHttpServer``) and its workers, instead of an engine fp8rl started.

The adapter of rollout rank 0 of each replica runs them after every sync (:class:`SyncChecks`; the sync of
step k also feeds step k's train–rollout numbers, captured in the trainer, to the behavioural alarm) with the
run's ``checks`` section from its payload (:mod:`fp8rl_core.verl.payload`) — with ``checks.engine_checksums``
also vLLM's own weight checksums against the learner's bytes — appends each report to the JSON-lines file the
payload names (the launcher logs them to the run's MLflow record) and, under ``checks.on_failure: fail``,
raises :class:`CheckFailedError` naming the condition, the rank and the layer — verl's trainer stops and the
run ends FAILED with that line. The verdicts on those reports: :mod:`fp8rl_core.verl.verdicts`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from fp8rl_core.checks.policy import SyncPlan
from fp8rl_core.verl.server_sampler import ServerSampler

if TYPE_CHECKING:
    from fp8rl_core.learner.config import LearnerConfig
    from fp8rl_core.verl.payload import VerlPayload

__all__ = ["CheckFailedError", "SyncChecks", "synced_learner"]


class CheckFailedError(RuntimeError):
    """A sync's checks failed under ``checks.on_failure: fail``."""


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
        self.runner = CheckRunner(payload.check_policy(), probe, payload.emittable)
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
        hooks = self.payload.hooks
        plan = SyncPlan(off=frozenset(hooks.checks_off(int(version))),  # a planted fault's switches: this sync only
                        cheap_only=hooks.cheap_tier(int(version)),  # the cadence set aside: full tier on suspicion
                        on_failure=hooks.on_failure(int(version)))
        report = self.runner.check(pipe, mismatch=numbers, step=int(version), plan=plan)
        if self.reports is not None:
            self.reports.parent.mkdir(parents=True, exist_ok=True)
            with open(self.reports, "a") as f:
                f.write(json.dumps(report.as_dict()) + "\n")
        verdict = report.verdict(plan.on_failure or self.payload.checks.on_failure)
        if verdict.fails_run:
            raise CheckFailedError(f"fp8rl checks failed at weight sync {report.sync} (version {report.version}): "
                                   + report.message())
        return report
