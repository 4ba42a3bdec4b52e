"""A sweep's runs: the expansion of a :class:`~fp8rl_core.config.sweep.SweepConfig` into runs
(``base`` × the cartesian product of the ``axes`` in file order, ``per_model`` settings merged over
``base``), each a :class:`Run` with its stable id, name and tags, and the :class:`Sweep` that holds them.

A run's id is the first 12 hex digits of the SHA-256 of its resolved config (canonical JSON, without
``models_dir``) and of its model spec's contents: the same run gets the same id on every machine, which
makes sweeps resumable (a run FINISHED in MLflow under its id is skipped). ``sweep``, ``description`` and
``resources`` are not part of it. A sweep is read and expanded once per invocation (:meth:`Sweep.load`,
each model spec read once); flows and tasks carry the :class:`Sweep` and its runs as they are.

Paths: a model name is looked up in ``<config dir>/models``; a relative ``base.models_dir`` is taken
relative to the config file's directory; a ``model`` given as a path to a ``.yaml`` spec is used as
written. docs/configs.md.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fp8rl_core.config.loading import ConfigError, read_sweep, set_dotted
from fp8rl_core.checks.policy import CheckPolicy
from fp8rl_core.config.schema import RunConfig
from fp8rl_core.config.sweep import SweepConfig
from fp8rl_core.errors import format_errors
from fp8rl_core.identity import content_hash, digest
from fp8rl_core.learner.checkpoints import spec_problems
from fp8rl_core.learner.spec import ModelSpec, spec_hash
from fp8rl_core.sampler.presets import PRESETS

__all__ = ["Run", "Sweep", "correctness_runs", "expand", "matching_runs", "run_description", "run_id", "run_name",
           "run_tags", "short_model", "sweep_id"]


#: fields added after run ids were first issued: left out of a run's id while they hold these values, so the
#: runs of an unchanged config keep their ids (a finished sweep is still skipped); section → field → value (a
#: section left empty is left out)
ID_NEUTRAL: dict[str, dict[str, object]] = {
    "checks": {k: getattr(CheckPolicy(), k) for k in ("compute_copy", "alarm", "alarm_jump", "alarm_warmup", "w7_min_prob", "w7_verdict",
                                                      "engine_checksums", "layout_tolerance", "history")},
    "verl": {"token_sequences": None, "overrides": [], "save_checkpoints": False},
    "sampler": {"engine": "vllm"},
    "data": {"prompt_key": "prompt", "train": None, "val": None, "max_prompt_length": None, "max_response_length": None,
             "reward": None, "sha256": None,
             "apply_chat_template_kwargs": {}},
}


#: fields moved after run ids were first issued: hashed where they were then (field → its old section, which
#: is in the run's dump when the field was there: ``verl.model_path`` of a verl run), so a run keeps its id
ID_PLACED: dict[str, str] = {"model_path": "verl"}


def run_id(run: RunConfig, spec: ModelSpec | None = None) -> str:
    """Stable id of a run: 12 hex digits of the content hash of its resolved config (less the
    :data:`ID_NEUTRAL` fields at their neutral values) and the *contents* of its model spec (``spec``, else
    read from its file; editing a spec file gives its runs new ids, so a resumed sweep does not skip runs of
    an older architecture)."""
    spec = run.spec() if spec is None else spec
    dump = run.model_dump(mode="json", exclude={"models_dir"})
    dump["sampler"] = run.sampler.flat()  # engine subsections hashed flat, where their fields were first
    for name, section in ID_PLACED.items():
        if isinstance(dump.get(section), dict):
            dump[section][name] = dump.pop(name)
        elif dump.get(name) is None:
            del dump[name]
    for section, fields in ID_NEUTRAL.items():
        part = dump.get(section)
        if isinstance(part, dict):
            dump[section] = {k: v for k, v in part.items() if not (k in fields and v == fields[k])}
            if not dump[section]:
                del dump[section]
    return content_hash(dump | {"model_spec": spec_hash(spec)}, 12)


def short_model(model: str) -> str:
    """A model's name without its family (``qwen3-dense-mini`` → ``dense-mini``) when two parts remain: the
    narrow name column of the UI shows the part that differs; the full name is the run's ``model`` tag."""
    family, _, rest = model.partition("-")
    return rest if "-" in rest else model


def run_name(cfg: RunConfig) -> str:
    """The run's short, distinct name: ``dense-mini·bf16-sampler·s0`` (model·preset·seed)."""
    return f"{short_model(cfg.model)}·{cfg.preset}·s{cfg.seed}"


def run_tags(cfg: RunConfig) -> dict[str, str]:
    """The tags a user groups and filters runs by (the full names)."""
    return {"model": cfg.model, "preset": cfg.preset, "seed": str(cfg.seed), "backend": cfg.backend,
            "learner_precision": PRESETS[cfg.preset].learner_precision if cfg.preset in PRESETS else ""}


def run_description(cfg: RunConfig) -> str:
    """The run's one line in the UI: what it ran."""
    what = PRESETS[cfg.preset].what if cfg.preset in PRESETS else cfg.preset
    return f"{cfg.model}, preset {cfg.preset} ({what}), seed {cfg.seed}, {cfg.loop.steps} RL steps"


@dataclass(frozen=True)
class Run:
    """One run of a sweep as its expansion made it, once: its stable ``id`` (:func:`run_id`), its ``name``
    and ``tags`` (:func:`run_name`, :func:`run_tags`), its validated ``config`` and the model ``spec`` its
    id was computed from. Flows and tasks carry it as it is (it pickles; no step re-reads or re-hashes it)."""

    id: str
    name: str
    tags: Mapping[str, str]
    config: RunConfig
    spec: ModelSpec

    @classmethod
    def of(cls, config: RunConfig, spec: ModelSpec | None = None) -> "Run":
        """The run of ``config`` (``spec``: its model spec when already read)."""
        spec = config.spec() if spec is None else spec
        return cls(run_id(config, spec), run_name(config), run_tags(config), config, spec)

    @property
    def description(self) -> str:
        return run_description(self.config)


def sweep_id(runs: Sequence[Run]) -> str:
    """The id of one expansion of a sweep: 12 hex digits of the SHA-256 of its runs' ids, comma-joined."""
    return digest(",".join(r.id for r in runs), 12)


def _merge(into: dict, settings: Mapping[str, Any], where: str = "") -> list[str]:
    """Merge ``settings`` (nested mappings) into ``into`` in place; returns the dotted keys it set."""
    done = []
    for k, v in settings.items():
        key = f"{where}{k}"
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            done += _merge(into[k], v, f"{key}.")
        else:
            into[k] = json.loads(json.dumps(v))
            done.append(key)
    return done


def expand(sweep: SweepConfig, source: str, models_dir: str,
           specs: MutableMapping[Path, ModelSpec] | None = None) -> list[Run]:
    """The sweep's runs: base × the cartesian product of the axes, validated, ids unique; each model spec
    read once (``specs``: the specs read so far, shared with the caller)."""
    specs = {} if specs is None else specs
    keys = list(sweep.axes)
    runs: list[Run] = []
    models_seen: set[str] = set()
    for combo in itertools.product(*(sweep.axes[k] for k in keys)) if keys else [()]:
        data = json.loads(json.dumps(sweep.base))
        given = data.get("models_dir")
        if given is None:
            data["models_dir"] = models_dir
        elif isinstance(given, str) and not Path(given).is_absolute():
            # relative to the config file's directory (models_dir is <config dir>/models), not the cwd
            data["models_dir"] = str((Path(models_dir).parent / given).resolve())
        for k, v in zip(keys, combo):
            set_dotted(data, k, v)
        where = ", ".join(f"{k}={v}" for k, v in zip(keys, combo))
        model = data.get("model", RunConfig.model_fields["model"].default)
        models_seen.add(str(model))
        if str(model) in sweep.per_model:
            for key in _merge(data, sweep.per_model[str(model)]):
                hit = [a for a in keys if a == key or key.startswith(f"{a}.") or a.startswith(f"{key}.")]
                if hit:
                    raise ConfigError(f"{source}: per_model.{model}.{key} conflicts with the axis {hit[0]!r}, which sets "
                                      f"it in every run; keep one of them")
        try:
            cfg = RunConfig.model_validate(data, context={"specs": specs})
            runs.append(Run.of(cfg, cfg.spec(specs)))
        except ValidationError as e:
            prefix = "base."
            msg = format_errors(source, e, RunConfig, prefix)
            raise ConfigError(msg + (f"\n  (in the run {where})" if where else "")) from None
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"{source}: {e}" + (f" (in the run {where})" if where else "")) from None
    unused = sorted(set(sweep.per_model) - models_seen)
    if unused:
        raise ConfigError(f"{source}: per_model names {unused}, which no run of this sweep uses; its models are "
                          f"{sorted(models_seen)}")
    ids = [r.id for r in runs]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"{source}: the axes produce identical runs (ids {dup}); remove the repeated values")
    return runs


def matching_runs(sweep: SweepConfig, runs: Sequence[Run], source: str) -> list[Run]:
    """A sweep with a ``matching`` section: each expanded run as a fixed-weights run — a warm start of its
    own seed (``warmstart.seed`` = the run's seed: each seed's checkpoints are other weights), RL for the
    section's last checkpoint's steps (``loop.steps``), an id that also hashes the section (a changed variant
    list, or a named checkpoint's changed weights, is a new run, not a resumed one), the name
    ``<model>·fixed-weights·s<seed>`` and the tag ``experiment``. Named ``checkpoints`` must be of the runs'
    model spec (:func:`fp8rl_core.learner.checkpoints.spec_problems`)."""
    section = sweep.matching
    if "preset" in sweep.axes:
        raise ConfigError(f"{source}: a sweep with a 'matching' section measures matching.presets at every "
                          "checkpoint; its runs' preset is the one RL runs to make the checkpoints after step 0 — "
                          "set base.preset, not an axis 'preset'")
    if (section.checkpoints is not None or section.steps[-1] > 0) and runs and runs[0].config.backend != "native":
        raise ConfigError(f"{source}: the fixed-weights experiment runs on the native backend; remove backend: verl")
    for i, ck in enumerate(section.checkpoints or ()):
        for spec in {r.spec.name: r.spec for r in runs}.values():
            problems = spec_problems(ck.path, spec)
            if problems:
                raise ConfigError(f"{source}: matching.checkpoints.{i} ({ck.path}) is not a checkpoint of the runs' "
                                  f"model {spec.name}: {'; '.join(problems)} (checkpoint vs spec); set base.model to a "
                                  "spec of its architecture (configs/models)")
    models = {r.config.model for r in runs}
    unknown = sorted(set(section.ablation_models or ()) - models)
    if unknown:
        raise ConfigError(f"{source}: matching.ablation_models names {unknown}, which no run of this sweep uses; its "
                          f"models are {sorted(models)}")
    out = []
    for run in runs:
        c = run.config
        cfg = c.model_copy(update={"loop": c.loop.model_copy(update={"steps": max([1, *section.steps])}),
                                   "warmstart": c.warmstart.model_copy(update={"seed": c.seed})})
        base = Run.of(cfg, run.spec)
        out.append(Run(digest(f"{base.id}:{section.id()}", 12), f"{short_model(cfg.model)}·fixed-weights·s{cfg.seed}",
                       dict(base.tags) | {"experiment": "fixed-weights"}, cfg, run.spec))
    return out


def correctness_runs(sweep: SweepConfig, path: str | Path,
                     specs: MutableMapping[Path, ModelSpec] | None = None) -> dict[str, Run]:
    """The correctness section's run per model kind (``dense``, ``moe``; {} without a section); errors
    name the file. ``specs``: as :meth:`RunConfig.spec`."""
    if sweep.correctness is None:
        return {}
    specs = {} if specs is None else specs
    try:
        configs = sweep.correctness.runs(str(Path(path).resolve().parent / "models"), specs)
        return {kind: Run.of(cfg, cfg.spec(specs)) for kind, cfg in configs.items()}
    except ValidationError as e:
        raise ConfigError(format_errors(str(path), e, RunConfig, "correctness.base.")) from None
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"{path}: correctness: {e}") from None


@dataclass(frozen=True)
class Sweep:
    """A sweep file read, validated and expanded once: its ``config`` (overrides applied), the file it was
    read from (``source``, as given) and the ``overrides``, its ``runs`` in expansion order (fixed-weights
    runs for a sweep with a ``matching`` section) and the ``correctness`` section's run per model kind.
    Flows carry it as it is: nothing reads the file again."""

    config: SweepConfig
    source: str
    overrides: tuple[str, ...]
    runs: tuple[Run, ...]
    correctness: Mapping[str, Run]

    @property
    def name(self) -> str:
        """The sweep's name: its MLflow experiment."""
        return self.config.sweep

    @property
    def id(self) -> str:
        """The id of this expansion (:func:`sweep_id` of its runs)."""
        return sweep_id(self.runs)

    @classmethod
    def load(cls, path: str | Path, overrides: Iterable[str] = ()) -> "Sweep":
        """Read the sweep file at ``path``, apply ``overrides``, validate and expand it into its runs, each
        model spec read once (:func:`fp8rl_core.config.loading.read_sweep`, :func:`expand`). Raises
        :class:`~fp8rl_core.config.loading.ConfigError`."""
        overrides = tuple(overrides)
        config = read_sweep(path, overrides)
        path = Path(path)
        specs: dict[Path, ModelSpec] = {}
        runs = expand(config, str(path), str(path.resolve().parent / "models"), specs)
        correctness = correctness_runs(config, path, specs)  # validated now, with the file named
        if config.matching is not None:
            runs = matching_runs(config, runs, str(path))
        return cls(config, str(path), overrides, tuple(runs), correctness)
