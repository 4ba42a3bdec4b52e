"""Supervised warm start: make a freshly built policy peaked on the addition task before RL.

Rule: teacher-forced cross-entropy on the answer tokens of training-split problems, AdamW with a
warmup–stable–decay learning rate (:func:`lr_factor`), float32 and seeded (bit-for-bit reproducible at a
given thread count); the checkpoint is a plain Hugging Face directory, content-addressed by
:func:`warmstart_key` and written atomically. Specified in docs/library.md (The warm start).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fp8rl_core.identity import content_hash

from .config import WarmStartConfig
from .models import build_model
from .spec import ModelSpec
from .task import EOS, PAD, AdditionTask, Prompts

if TYPE_CHECKING:  # transformers is imported where a model is built or read: a driving process never loads it
    from transformers import PreTrainedModel

__all__ = [
    "WARMSTART_VERSION",
    "WarmStartResult",
    "answer_entropy",
    "evaluate_policy",
    "greedy_generate",
    "is_complete",
    "checkpoint_shape_errors",
    "load_policy",
    "lr_factor",
    "warm_start",
    "warmstart_key",
]

# Bump when the training procedure changes in a way that changes the weights it produces.
WARMSTART_VERSION = 1
METRICS_FILE = "warmstart.json"
_REQUIRED = ("config.json", "model.safetensors", METRICS_FILE)


@dataclass(frozen=True)
class WarmStartResult:
    """Where the warm-started checkpoint is and how good it is.

    ``seconds`` is the wall time of the training run that produced the checkpoint (also when it is reused);
    ``final_loss`` the mean answer cross-entropy over the last 10 % of steps.
    """

    path: Path
    accuracy: float
    mean_entropy: float
    reused: bool
    steps: int
    seconds: float
    key: str
    final_loss: float


def warmstart_key(spec: ModelSpec, cfg: WarmStartConfig) -> str:
    """16 hex digits of the SHA-256 of everything that determines the weights (not ``progress``)."""
    import transformers

    ident = {
        "spec": spec.model_dump(mode="json"),
        "cfg": cfg.model_dump(mode="json"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "warmstart_version": WARMSTART_VERSION,
    }
    return content_hash(ident, 16)


def lr_factor(step: int, cfg: WarmStartConfig) -> float:
    """Multiplier of ``cfg.lr`` at optimiser step ``step`` (0-based): warmup, constant, linear decay.

    ``(step + 1) / warmup`` during the first ``warmup`` steps; 1 until the last ``cfg.decay_steps`` steps;
    then ``(steps − step) / decay_steps`` (the last step runs at ``1 / decay_steps``).
    """
    decay_start = cfg.steps - cfg.decay_steps
    if step >= decay_start:
        return (cfg.steps - step) / cfg.decay_steps
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    return 1.0


@torch.no_grad()
def greedy_generate(
    model: torch.nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int, *, eos_id: int = EOS, pad_id: int = PAD
) -> torch.Tensor:
    """Greedy (argmax, first index on ties) continuation of equal-length prompts with a KV cache.

    ``prompt_ids`` [B, P] must hold no padding (every row is attended in full). Returns [B, max_new_tokens]:
    each row's tokens up to and including its first ``eos_id``, then ``pad_id``. Stops early once every
    row has ended. The model is run in eval mode and restored to its previous mode.
    """
    if prompt_ids.dim() != 2 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must have shape [B, P] with P ≥ 1, got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    b = prompt_ids.shape[0]
    out = torch.full((b, max_new_tokens), pad_id, dtype=torch.long)
    done = torch.zeros(b, dtype=torch.bool)
    was_training = model.training
    model.eval()
    try:
        past, inp = None, prompt_ids
        for t in range(max_new_tokens):
            o = model(input_ids=inp, past_key_values=past, use_cache=True, logits_to_keep=1)
            past = o.past_key_values
            tok = o.logits[:, -1].argmax(dim=-1)
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            out[:, t] = tok
            done |= tok == eos_id
            if bool(done.all()):
                break
            inp = tok.unsqueeze(1)
    finally:
        model.train(was_training)
    return out


def _answer_logits(model: torch.nn.Module, prompts: Prompts) -> torch.Tensor:
    """Teacher-forced logits [n, A, V] at the positions that predict the answer tokens."""
    seq = prompts.sequences
    return model(input_ids=seq[:, :-1], use_cache=False, logits_to_keep=prompts.answer_ids.shape[1]).logits


@torch.no_grad()
def answer_entropy(model: torch.nn.Module, prompts: Prompts, chunk: int = 256) -> float:
    """Mean entropy (nats) of the next-token distribution over the answer positions, teacher-forced."""
    was_training = model.training
    model.eval()
    try:
        total, count = 0.0, 0
        for i in range(0, len(prompts), chunk):
            part = Prompts(*(t[i : i + chunk] for t in (prompts.prompt_ids, prompts.answer_ids, prompts.a, prompts.b)))
            logp = torch.log_softmax(_answer_logits(model, part).float(), dim=-1)
            ent = -(logp.exp() * logp).sum(dim=-1)
            total += float(ent.sum())
            count += ent.numel()
    finally:
        model.train(was_training)
    return total / count


@torch.no_grad()
def evaluate_policy(
    model: torch.nn.Module, task: AdditionTask, prompts: Prompts, chunk: int = 256
) -> tuple[float, float]:
    """(exact-match greedy accuracy, mean answer entropy in nats) of ``model`` on ``prompts``."""
    exact = 0
    for i in range(0, len(prompts), chunk):
        part = Prompts(*(t[i : i + chunk] for t in (prompts.prompt_ids, prompts.answer_ids, prompts.a, prompts.b)))
        completion = greedy_generate(model, part.prompt_ids, task.answer_len)
        exact += int((task.reward(part, completion) == 1.0).sum())
    return exact / len(prompts), answer_entropy(model, prompts, chunk)


def is_complete(path: str | Path) -> bool:
    """True when ``path`` holds a finished warm-start checkpoint (config, weights and metrics)."""
    path = Path(path)
    return all((path / f).is_file() for f in _REQUIRED)


def checkpoint_shape_errors(path: str | Path) -> list[str]:
    """Tensors of ``path/model.safetensors`` whose shape disagrees with what ``path/config.json`` builds
    (read from the safetensors header and a model built on the meta device — nothing is loaded), each
    as ``name: checkpoint [..] vs config [..]``; names the config expects but the file lacks (tied
    embeddings excepted) are listed too."""
    import transformers
    from safetensors import safe_open

    path = Path(path)
    config = transformers.AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    want = {n: list(t.shape) for n, t in model.state_dict().items()}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    errors = []
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        have = {n: list(f.get_slice(n).get_shape()) for n in f.keys()}
    have |= _fused_expert_shapes(have)
    for name, shape in sorted(have.items()):
        if name in want and want[name] != shape:
            errors.append(f"{name}: checkpoint {shape} vs config {want[name]}")
    missing = sorted(n for n in want if n not in have and not (tied and n == "lm_head.weight"))
    errors += [f"{n}: in the config's model, missing from the checkpoint (config {want[n]})" for n in missing]
    return errors


def _fused_expert_shapes(have: dict[str, list[int]]) -> dict[str, list[int]]:
    """The checkpoint stores experts one by one (``….experts.E.gate_proj.weight`` [I, H], ``up_proj``,
    ``down_proj`` [H, I]); transformers fuses them on load into ``….experts.gate_up_proj`` [E, I_gate+I_up, H]
    and ``….experts.down_proj`` [E, H, I]. The fused shapes the file implies, for the comparison."""
    import re

    per: dict[str, dict[int, dict[str, list[int]]]] = {}
    for name, shape in have.items():
        m = re.fullmatch(r"(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight", name)
        if m:
            per.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = shape
    out = {}
    for prefix, experts in per.items():
        first = experts[min(experts)]
        if "gate_proj" in first and "up_proj" in first:
            out[f"{prefix}.gate_up_proj"] = [len(experts), first["gate_proj"][0] + first["up_proj"][0], first["gate_proj"][1]]
        if "down_proj" in first:
            out[f"{prefix}.down_proj"] = [len(experts), *first["down_proj"]]
    return out


def load_policy(path: str | Path) -> PreTrainedModel:
    """Load a checkpoint directory as a float32 causal LM with eager attention, in eval mode.

    Shapes are checked first (:func:`checkpoint_shape_errors`): a checkpoint that disagrees with its
    config fails naming the tensor and both shapes, not with a reinitialised layer or a loader trace."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json here; expected a Hugging Face checkpoint directory")
    if (path / "model.safetensors").is_file():
        errors = checkpoint_shape_errors(path)
        if errors:
            raise ValueError(f"{path}: model.safetensors disagrees with config.json in {len(errors)} tensors: "
                             + "; ".join(errors[:5]) + ("" if len(errors) <= 5 else f"; … {len(errors) - 5} more"))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def _read_result(path: Path, key: str, reused: bool) -> WarmStartResult:
    metrics_file = path / METRICS_FILE
    try:
        m = json.loads(metrics_file.read_text())
        if m["key"] != key:
            raise ValueError(f"{metrics_file}: key is {m['key']!r}, but the directory name says {key!r}")
        return WarmStartResult(path, float(m["accuracy"]), float(m["mean_entropy"]), reused, int(m["steps"]),
                               float(m["seconds"]), key, float(m["final_loss"]))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{metrics_file}: unreadable warm-start metrics ({e!r}); delete {path} to retrain") from None


def _train(spec: ModelSpec, cfg: WarmStartConfig, progress: bool) -> tuple[PreTrainedModel, float]:
    task = cfg.task
    model = build_model(spec, cfg.seed)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8,
    )
    tail = max(1, cfg.steps // 10)
    tail_losses: list[float] = []
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("warm start {task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("loss {task.fields[loss]:.4f}"), TimeRemainingColumn())
        bar_task = bar.add_task(spec.name, total=cfg.steps, loss=float("nan"))
        bar.start()
    try:
        for step in range(cfg.steps):
            for group in opt.param_groups:
                group["lr"] = cfg.lr * lr_factor(step, cfg)
            batch = task.prompts(cfg.batch_size, seed=(cfg.seed << 31) + step, split="train")
            logits = _answer_logits(model, batch)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.answer_ids.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            if step >= cfg.steps - tail:
                tail_losses.append(loss.detach().item())
            if bar is not None:
                bar.update(bar_task, advance=1, loss=loss.detach().item())
    finally:
        if bar is not None:
            bar.stop()
    model.eval()
    return model, sum(tail_losses) / len(tail_losses)


def _publish(tmp: Path, final: Path) -> bool:
    """Rename the finished ``tmp`` to ``final``; False (and ``tmp`` removed) if another run got there first."""
    if final.exists() or final.is_symlink():
        if is_complete(final):
            shutil.rmtree(tmp)
            return False
        stale = Path(tempfile.mkdtemp(prefix=f".{final.name}.stale-", dir=final.parent))
        os.rename(final, stale / "old")
        shutil.rmtree(stale)
    try:
        os.rename(tmp, final)
    except OSError:  # another writer published between the check above and here
        if not is_complete(final):
            raise
        shutil.rmtree(tmp)
        return False
    return True


def warm_start(
    spec: ModelSpec, cfg: WarmStartConfig, cache_root: str | Path, *, progress: bool = False
) -> WarmStartResult:
    """The warm-started checkpoint for (spec, cfg) under ``cache_root``: reused if complete, else trained.

    Training, metrics, content addressing and the atomic write: docs/library.md (The warm start).
    """
    import transformers

    task = cfg.task
    if task.seq_len - 1 > spec.max_position_embeddings:
        raise ValueError(
            f"spec {spec.name!r}: max_position_embeddings = {spec.max_position_embeddings} is shorter than the "
            f"task's sequences ({task.seq_len - 1} input tokens for digits={task.digits}); raise it or use fewer digits"
        )
    key = warmstart_key(spec, cfg)
    cache_root = Path(cache_root)
    final = cache_root / f"{spec.name}-{key}"
    if is_complete(final):
        return _read_result(final, key, reused=True)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        model, final_loss = _train(spec, cfg, progress)
        seconds = time.perf_counter() - t0
        eval_prompts = task.prompts(cfg.eval_prompts, seed=cfg.seed, split="eval")
        accuracy, entropy = evaluate_policy(model, task, eval_prompts)

    result = WarmStartResult(final, accuracy, entropy, False, cfg.steps, seconds, key, final_loss)
    metrics = {k: v for k, v in asdict(result).items() if k not in ("path", "reused")}
    metrics |= {
        "spec": spec.model_dump(mode="json"),
        "config": cfg.model_dump(mode="json"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "warmstart_version": WARMSTART_VERSION,
        "torch_threads": torch.get_num_threads(),
    }
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=cache_root))
    try:
        model.save_pretrained(tmp, save_original_format=True)
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
