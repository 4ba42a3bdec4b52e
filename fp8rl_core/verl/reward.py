"""fp8rl's task reward as verl's ``custom_reward_function`` (``reward.custom_reward_function.path =
pkg://fp8rl_core.verl.reward``, ``name = compute_score``); and a dataset's scorer for the native loop
(:func:`scorer`: the user's function or verl's ``default_compute_score``, as a verl run of the config scores).

verl's reward manager (``naive``: ``verl/experimental/reward_loop/reward_manager/naive.py``) calls, per
response, ``compute_score(data_source=…, solution_str=…, ground_truth=…, extra_info=…)`` with the response
decoded by ``skip_special_tokens=True`` and the row's ``reward_model.ground_truth`` and ``extra_info``
(:mod:`fp8rl_core.verl.data` writes them). The score is fp8rl's own
:meth:`fp8rl_core.learner.task.AdditionTask.reward`, not a second implementation: the text is read back
into the task's ids (:func:`completion_ids`) and scored with the row's task against the row's operands.

So a completion scores as in the native loop: 1.0 for the exact answer closed by ``$`` (the task's EOS,
kept as text: data.py explains why), 0.5 × the fraction of right digit positions before any ``$``
otherwise, 0.0 for none.
"""

from __future__ import annotations

from typing import Any

import torch

from fp8rl_core.learner.task import TASK_VOCAB_SIZE, AdditionTask, decode, encode

__all__ = ["OTHER", "completion_ids", "compute_score", "scorer"]

#: the id a character outside the task's spelling reads as (the task never produces it: never a right digit)
OTHER = TASK_VOCAB_SIZE


def completion_ids(text: str) -> list[int]:
    """The task ids of a decoded completion, one per character: the task's spelling (``encode``), any other
    character (a space, a letter, ``[``) → :data:`OTHER`. ``'2010$'`` → ``[7, 5, 6, 5, 2]``."""
    out = []
    for ch in text:
        try:
            out.extend(encode(ch))
        except ValueError:
            out.append(OTHER)
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  **_: Any) -> float:
    """verl's reward of one response: fp8rl's addition reward of ``solution_str`` for the row's problem.

    ``extra_info`` must carry the row's ``task`` (AdditionTask fields) and operands ``a``, ``b`` (as
    :func:`fp8rl_core.verl.data.data_rows` writes); ``ground_truth`` must be that problem's answer — a row
    whose answer disagrees with its operands is refused rather than scored. Extra keyword arguments
    (verl's reward-router settings) are ignored."""
    from fp8rl_core.verl.data import DATA_SOURCE

    if data_source != DATA_SOURCE:
        raise ValueError(f"fp8rl's reward scores data_source {DATA_SOURCE!r} rows only, got {data_source!r}")
    info = extra_info or {}
    missing = [k for k in ("task", "a", "b") if info.get(k) is None]
    if missing:
        raise ValueError(f"extra_info lacks {missing}: the row was not written by fp8rl_core.verl.data")
    task = AdditionTask.model_validate(dict(info["task"]))
    prompts = task.make(torch.tensor([int(info["a"])]), torch.tensor([int(info["b"])]))
    if decode(prompts.answer_ids[0]) != ground_truth:
        raise ValueError(f"ground_truth {ground_truth!r} is not the answer to {int(info['a'])} + {int(info['b'])} "
                         f"({decode(prompts.answer_ids[0])!r}) under the row's task")
    ids = torch.tensor([completion_ids(solution_str)], dtype=torch.int64).reshape(1, -1)
    return float(task.reward(prompts, ids)[0])


def scorer(spec: str | None):
    """What scores a dataset's completions in the native loop, as in a verl run of the same config: the function
    ``spec`` names (``data.reward``: :func:`fp8rl_core.config.dataset.reward_function`) or, None, verl's
    ``default_compute_score`` (``verl/utils/reward_score/__init__.py``), which picks a scorer by the row's
    ``data_source``."""
    if spec is not None:
        from fp8rl_core.config.dataset import reward_function

        return reward_function(spec)
    from verl.utils.reward_score import default_compute_score

    return default_compute_score
