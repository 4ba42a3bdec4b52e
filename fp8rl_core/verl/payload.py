"""What a verl run's processes receive from fp8rl: one validated, versioned payload (docs/gpu.md, "The payload").

The launcher builds :class:`VerlPayload` once from the run (:meth:`VerlPayload.of`: the run's own ``learner``,
``sampler`` and ``checks`` sections, its preset and model spec, the rollout's per-layer schemes, the W7 probe,
where the check reports and the trainer's captured tokens go, the hooks of its syncs), writes it as JSON into the run's work folder, and verl's
config names that file in one environment variable of every Ray worker (:data:`PAYLOAD_ENV`). fp8rl's pieces
inside verl — the learner engine, the rollout adapter and its checks, the worker extension — read it through
:func:`payload`: validated once per process; a file of another schema version or one that does not validate is
refused with one line naming the file.

Fault injection: the payload's ``hooks`` (:class:`VerlHooks`, empty in production) is the one hooks object of
a verl run's syncs — for a rank's sync of a version it gives the :class:`~fp8rl_core.sync.hooks.SyncHooks`
the worker's load runs (:meth:`VerlHooks.at`): a catalogue fault planted there, else the no-op hooks; and the
check switches a plant turns off at its sync (:meth:`VerlHooks.checks_off`), so a test can leave a fault to the
behavioural alarm, the ``checks.on_failure`` its sync is judged under (:meth:`VerlHooks.on_failure`), so one
run can go on past some plants and stop at another, and whether its sync is checked at the cheap tier
(:meth:`VerlHooks.cheap_tier`), so a fault must be caught by the cheap tier alone.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fp8rl_core.checks.policy import CheckPolicy
from fp8rl_core.config.sections import LearnerSection, known_preset
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sync.hooks import NO_HOOKS, SyncHooks

if TYPE_CHECKING:
    from fp8rl_core.config.runs import Run
    from fp8rl_core.config.schema import RunConfig
    from fp8rl_core.learner.config import LearnerConfig

__all__ = ["NO_VERL_HOOKS", "PAYLOAD_ENV", "PAYLOAD_FILE", "PAYLOAD_VERSION", "PayloadError", "PlantedFault",
           "RAY_ADDRESS_FILE", "TOKENS_DIR",
           "VerlHooks", "VerlPayload", "payload", "rollout_schemes", "uses_fp8rl_method"]

#: the payload's schema version: a reader refuses any other
PAYLOAD_VERSION = 1
#: environment variable of every Ray worker naming the payload file (the one thing fp8rl puts there)
PAYLOAD_ENV = "FP8RL_VERL_PAYLOAD"
#: the payload's file name in the run's work folder
PAYLOAD_FILE = "payload.json"
#: the folder of the run's captured tokens in its work folder (:mod:`fp8rl_core.verl.capture`)
TOKENS_DIR = "tokens"
#: the file beside the payload where verl's first worker writes the address of the Ray cluster it runs in
#: (:mod:`fp8rl_core.verl.extension`); the launcher tags the run with it (``ray.address``)
RAY_ADDRESS_FILE = "ray_address"


class PayloadError(ValueError):
    """A payload file that cannot be used (missing, another schema version, invalid): one line naming it."""


class PlantedFault(BaseModel):
    """A catalogue fault the workers' load plants: on tensor-parallel rank ``rank`` (None: every rank) at the
    sync of ``version`` (None: every sync). Only faults that act in the worker's load (stages ``load`` /
    ``post-load``) travel through verl."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    rank: int | None = Field(None, ge=0)
    version: int | None = Field(None, ge=0)
    #: check switches (:class:`~fp8rl_core.checks.policy.CheckPolicy` fields) off at this plant's sync: the fault
    #: is then left to what else can see it (``compute_copy`` off: the behavioural alarm at the next sync)
    checks_off: tuple[Literal["compute_copy"], ...] = ()
    #: what a failed check does at this plant's sync (None: the run's ``checks.on_failure``): ``fail`` stops
    #: verl's trainer there, ``warn`` lets it go on
    on_failure: Literal["warn", "fail"] | None = None
    #: this plant's sync checked at the cheap tier: the run's cadence (``checks.full_every``) set aside there, so the
    #: full tier runs only if the cheap tier fails (a fault the cheap tier must catch on its own)
    cheap_tier: bool = False

    @field_validator("name")
    @classmethod
    def _worker_fault(cls, v: str) -> str:
        from fp8rl_core.checks.faults import fault

        try:
            f = fault(v)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
        if f.worker is None:
            raise ValueError(f"fault {v!r} acts at stage {f.stage!r}; through verl only worker faults "
                             "(stage load / post-load) can be planted")
        return v


class VerlHooks(BaseModel):
    """The hooks of a verl run's syncs (module docstring); empty — every sync the no-op hooks — in production."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    faults: tuple[PlantedFault, ...] = ()

    def at(self, rank: int, version: int) -> SyncHooks:
        """The sync hooks of rank ``rank``'s load at ``version``: the first planted fault that matches, else
        :data:`~fp8rl_core.sync.hooks.NO_HOOKS`."""
        from fp8rl_core.checks.faults import fault

        for p in self.faults:
            if p.rank in (None, rank) and p.version in (None, version):
                return fault(p.name)
        return NO_HOOKS

    def checks_off(self, version: int) -> set[str]:
        """The check switches a plant at the sync of ``version`` turns off (on every rank's checks)."""
        return {c for p in self.faults if p.version in (None, version) for c in p.checks_off}

    def on_failure(self, version: int) -> str | None:
        """What a failed check does at the sync of ``version`` by a plant there (None: the run's setting)."""
        return next((p.on_failure for p in self.faults if p.version in (None, version) and p.on_failure), None)

    def cheap_tier(self, version: int) -> bool:
        """Whether a plant at the sync of ``version`` has that sync checked at the cheap tier (the cadence set aside)."""
        return any(p.cheap_tier for p in self.faults if p.version in (None, version))

    def names(self) -> list[str]:
        return [p.name for p in self.faults]


NO_VERL_HOOKS = VerlHooks()


def uses_fp8rl_method(config: "RunConfig") -> bool:
    """Whether the run's rollout loads with fp8rl's vLLM quantization method: a vLLM rollout on CPU (every
    preset), or on GPUs with layers on the learner's grid (``half``, ``all``, ``requant``); not a GPU BF16
    rollout, verl's own block FP8 (``other-grid``) or SGLang (its own MXFP8 method)."""
    from fp8rl_core.grids.schemes import VerlRollout
    from fp8rl_core.sampler.capabilities import capabilities
    from fp8rl_core.sampler.presets import PRESETS

    if config.verl is None or not capabilities(config.verl.rollout).fp8rl_method:
        return False
    return config.verl.hardware == "cpu" or PRESETS[config.preset].scheme.verl is VerlRollout.FP8RL


def rollout_schemes(config: "RunConfig", spec: ModelSpec) -> dict[str, str]:
    """vLLM layer prefix → fp8rl scheme of the run's preset, over the GEMM layers of a meta-device build of
    ``spec`` (no memory, no weights)."""
    import torch
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    from fp8rl_core.learner.patterns import gemm_layers
    from fp8rl_core.sampler.presets import PRESETS

    with torch.device("meta"):
        model = (Qwen3MoeForCausalLM if spec.is_moe else Qwen3ForCausalLM)(spec.hf_config())
    return PRESETS[config.preset].schemes(gemm_layers(model))


class VerlPayload(BaseModel):
    """What verl's processes need from fp8rl for one run (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = PAYLOAD_VERSION
    run_id: str
    spec: ModelSpec  #: the run's model spec (the one its id was computed from)
    preset: str
    learner: LearnerSection
    sampler: SamplerConfig
    checks: CheckPolicy
    #: vLLM layer prefix → scheme where the rollout loads with fp8rl's method (empty: it does not), its MX grid
    rollout_schemes: dict[str, str] = {}
    mx_grid: str
    probe: tuple[tuple[int, ...], ...] = ()  #: W7's held-out probe batch (token ids)
    #: the ids the rollout can emit (verl's vLLM rollout masks the rest: fp8rl_core.learner.vocab_tail; None: all)
    emittable: int | None = Field(None, ge=1)
    reports: str | None = None  #: the JSON-lines file each sync's check report is appended to
    #: the folder the trainer writes each step's tokens and alarm numbers to (:mod:`fp8rl_core.verl.capture`)
    tokens: str | None = None
    token_sequences: int | None = Field(None, ge=1)  #: sequences captured per step (None: all)
    hooks: VerlHooks = NO_VERL_HOOKS

    @field_validator("schema_version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != PAYLOAD_VERSION:
            raise ValueError(f"schema version {v}; this fp8rl reads version {PAYLOAD_VERSION}")
        return v

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str) -> str:
        return known_preset(v)

    @classmethod
    def of(cls, run: "Run", data_dir: str | Path, hooks: VerlHooks = NO_VERL_HOOKS) -> "VerlPayload":
        """The payload of ``run`` (its config and spec as the sweep's expansion made them), its check reports
        in ``data_dir``."""
        from fp8rl_core.learner.config import Recipe

        cfg = run.config
        return cls(run_id=run.id, spec=run.spec, preset=cfg.preset, learner=cfg.learner, sampler=cfg.sampler,
                   checks=cfg.checks,
                   rollout_schemes=rollout_schemes(cfg, run.spec) if uses_fp8rl_method(cfg) else {},
                   mx_grid=Recipe(rule=cfg.learner.rule).fwd_grid,
                   probe=tuple(tuple(row) for row in cfg.check_probe().tolist()), emittable=cfg.emittable(),
                   reports=str(Path(data_dir) / "checks.jsonl"), tokens=str(Path(data_dir) / TOKENS_DIR),
                   token_sequences=cfg.verl.token_sequences if cfg.verl is not None else None, hooks=hooks)

    def learner_config(self) -> "LearnerConfig":
        """The run's learner config (precision and layers of its preset, the ``learner`` section's recipe)."""
        from fp8rl_core.sampler.presets import PRESETS

        return self.learner.build(PRESETS[self.preset])

    def check_policy(self) -> "CheckPolicy":
        """The checks' policy (cadence, W7 bound for the run's engine dtype and preset)."""
        return self.checks.for_engine(self.sampler.dtype, self.preset)

    def dumps(self) -> str:
        """The payload as JSON, one top-level field a line."""
        d = self.model_dump(mode="json")
        return "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(d[k], sort_keys=True)}" for k in sorted(d)) + "\n}\n"

    def write(self, path: str | Path) -> Path:
        """Write the payload to ``path`` (JSON); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.dumps())
        return path

    @classmethod
    def read(cls, path: str | Path) -> "VerlPayload":
        """The payload in ``path``, validated; :class:`PayloadError` (one line) when it cannot be used."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise PayloadError(f"verl payload {path}: cannot be read ({type(e).__name__}: {e})") from None
        if not isinstance(data, dict):
            raise PayloadError(f"verl payload {path}: a JSON object expected, got {type(data).__name__}")
        if data.get("schema_version") != PAYLOAD_VERSION:
            raise PayloadError(f"verl payload {path}: schema version {data.get('schema_version')!r}, this fp8rl "
                               f"reads version {PAYLOAD_VERSION} (launch the run with the fp8rl its workers run)")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(top level)"
            more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
            raise PayloadError(f"verl payload {path}: {where}: {first['msg']}{more}") from None


@functools.cache
def _read(path: str) -> VerlPayload:
    return VerlPayload.read(path)


def payload(environ: Any = None) -> VerlPayload | None:
    """This process's payload: the file :data:`PAYLOAD_ENV` names, read and validated once per process;
    None where the variable is unset (verl without fp8rl's launcher: its engine and rollout run unchanged)."""
    path = (os.environ if environ is None else environ).get(PAYLOAD_ENV)
    return _read(path) if path else None
