"""Compose fp8rl's overrides under the installed verl's own Hydra config and run verl's own validation.

This is what ``python -m verl.trainer.main_ppo <overrides>`` does before it starts Ray: Hydra composes
``verl/trainer/config/ppo_trainer.yaml`` (from the installed verl package, not a copy) with the override
list, then ``main`` calls ``validate_config``; the workers later turn the actor and rollout sections into
verl's dataclasses (``omega_conf_to_dataclass``), whose ``__post_init__`` checks more. :func:`compose`
and :func:`validate` run the same steps without a GPU, so a config that would fail on the cluster fails
here first — with verl's own message, plus the fp8rl fields behind the keys it names
(:class:`VerlConfigError`).

``HFModelConfig`` reads ``config.json`` from ``model.path`` (and imports ``model.external_lib``); for a
check without the checkpoint, point ``model_dir`` at a directory holding only the model's ``config.json``
(:func:`write_model_config` writes it from the fp8rl model spec).
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fp8rl_core.verl.overrides import Override

__all__ = ["VerlConfigError", "check", "compose", "config_dir", "validate", "write_model_config"]


class VerlConfigError(ValueError):
    """verl rejected the generated config; ``verl_message`` is verl's own text, ``fields`` the fp8rl fields
    whose overrides set the keys it names (empty when the message names none)."""

    def __init__(self, stage: str, verl_message: str, culprits: Sequence[Override]):
        self.stage, self.verl_message = stage, verl_message
        self.fields = sorted({o.source for o in culprits})
        keys = "; ".join(f"{o.hydra()}  (from fp8rl field {o.source})" for o in culprits)
        hint = f"\n  set by fp8rl: {keys}" if culprits else "\n  (verl's message names no key fp8rl set)"
        super().__init__(f"verl {stage} failed: {verl_message}{hint}")


def config_dir() -> Path:
    """The installed verl's Hydra config directory (``verl/trainer/config``)."""
    import verl.trainer

    return Path(verl.trainer.__file__).parent / "config"


def culprits(message: str, overrides: Sequence[Override]) -> list[Override]:
    """The overrides whose key verl's message names: the full key, or a word of the message that is (or
    contains) the key's last component (``n_gpus`` ↔ ``n_gpus_per_node``, ``model_parallel_size`` ↔
    ``tensor_model_parallel_size``); words shorter than 5 characters are not matched."""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]{4,}", message))
    out = []
    for o in overrides:
        leaf = o.key.rsplit(".", 1)[-1]
        if o.key in message or any(len(leaf) >= 5 and (w in leaf or leaf in w) for w in words if "_" in w or w == leaf):
            out.append(o)
    return out


def compose(overrides: Sequence[Override]) -> Any:
    """verl's ``ppo_trainer`` config (an OmegaConf DictConfig) with ``overrides`` applied, by Hydra."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            return hydra_compose(config_name="ppo_trainer", overrides=[o.hydra() for o in overrides])
    except (HydraException, OmegaConfBaseException) as e:
        msg = str(e)
        raise VerlConfigError("Hydra composition", msg, culprits(msg, overrides)) from None


def validate(cfg: Any, overrides: Sequence[Override] = ()) -> str:
    """verl's own checks on a composed config: the actor, rollout and model sections as verl's dataclasses
    and ``validate_config`` as ``main_ppo.main`` calls it. Returns what ``validate_config`` printed."""
    from hydra.errors import HydraException
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    printed = io.StringIO()
    stage = "config check"
    try:
        for stage, node in (("actor config", cfg.actor_rollout_ref.actor), ("rollout config", cfg.actor_rollout_ref.rollout),
                            ("model config", cfg.actor_rollout_ref.model)):
            omega_conf_to_dataclass(node)
        stage = "validate_config"
        with contextlib.redirect_stdout(printed):
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError, TypeError, NotImplementedError, HydraException) as e:
        msg = str(e) or type(e).__name__
        raise VerlConfigError(stage, msg, culprits(msg, overrides)) from None
    return printed.getvalue()


def write_model_config(run: Any, directory: str | Path) -> Path:
    """``config.json`` of the model of ``run`` (a :class:`~fp8rl_core.config.Run`: its fp8rl spec) in
    ``directory``; returns the directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg = run.spec.hf_config()
    cfg.architectures = ["Qwen3MoeForCausalLM" if run.spec.is_moe else "Qwen3ForCausalLM"]
    cfg.to_json_file(str(directory / "config.json"))
    return directory


def check(run: Any, overrides: Sequence[Override]) -> tuple[Any, str]:
    """Compose ``overrides`` and validate the result as verl would, with ``model.path`` pointed (for the
    validation only) at a temporary directory holding the ``config.json`` of ``run`` (a Run). Returns the composed
    config (with the real model path) and verl's validation output. Raises :class:`VerlConfigError`."""
    import tempfile

    from omegaconf import OmegaConf

    cfg = compose(overrides)
    local = OmegaConf.create(OmegaConf.to_container(cfg))
    with tempfile.TemporaryDirectory(prefix="fp8rl-verl-model-") as tmp:
        local.actor_rollout_ref.model.path = str(write_model_config(run, tmp))
        printed = validate(local, overrides)
    return cfg, printed
