"""The synthetic addition task: vocabulary, prompts, rewards and the held-out split."""

from __future__ import annotations

import pytest
import torch

from fp8rl_core.learner.task import BOS, EOS, EQUALS, PAD, PLUS, AdditionTask, Prompts, decode, encode


def test_vocabulary_ids():
    assert (PAD, BOS, EOS, PLUS, EQUALS) == (0, 1, 2, 3, 4)
    assert decode(list(range(15))) == "_^$+=0123456789"
    assert encode("^12+34=") == [1, 6, 7, 3, 8, 9, 4]
    assert encode("46$_") == [9, 11, 2, 0]


@pytest.mark.parametrize("ids", [[1, 5, 14, 2, 0], [17, 3, 1023], []])
def test_encode_decode_round_trip(ids):
    assert encode(decode(ids)) == ids
    assert decode(torch.tensor(ids, dtype=torch.long)) == decode(ids)


def test_decode_spells_ids_outside_the_task_vocabulary():
    assert decode([1, 15, 200]) == "^[15][200]"


def test_encode_rejects_unknown_characters():
    with pytest.raises(ValueError, match=r"cannot encode 'x' at position 2 of '12x'; valid characters are"):
        encode("12x")


@pytest.mark.parametrize(
    "digits, rev_ops, rev_ans, a, b, prompt, answer",
    [
        (3, True, True, 7, 95, "^700+590=", "2010$"),  # 102; every number least significant digit first
        (3, False, True, 7, 95, "^007+095=", "2010$"),  # operands in written order
        (3, False, False, 7, 95, "^007+095=", "0102$"),  # everything in written order
        (3, True, False, 7, 95, "^700+590=", "0102$"),
        (3, True, True, 999, 999, "^999+999=", "8991$"),  # 1998
        (2, True, True, 12, 34, "^21+43=", "640$"),
        (2, True, True, 0, 0, "^00+00=", "000$"),
        (1, True, True, 9, 8, "^9+8=", "71$"),
        (5, True, True, 12345, 99999, "^54321+99999=", "443211$"),  # 112344
    ],
)
def test_make_spells_prompt_and_answer(digits, rev_ops, rev_ans, a, b, prompt, answer):
    task = AdditionTask(digits=digits, reverse_operands=rev_ops, reverse_answer=rev_ans)
    p = task.make([a], [b])
    assert decode(p.prompt_ids[0]) == prompt and decode(p.answer_ids[0]) == answer
    assert p.prompt_ids.shape == (1, task.prompt_len) == (1, 2 * digits + 3)
    assert p.answer_ids.shape == (1, task.answer_len) == (1, digits + 2)
    assert decode(p.sequences[0]) == prompt + answer


def test_defaults_are_little_endian_three_digit():
    task = AdditionTask()
    assert (task.digits, task.reverse_operands, task.reverse_answer, task.eval_fraction) == (3, True, True, 0.1)


def test_make_rejects_operands_out_of_range():
    with pytest.raises(ValueError, match="operands must lie in 0..99 for digits=2"):
        AdditionTask(digits=2).make([100], [1])


@pytest.mark.parametrize("digits", [1, 2, 3, 4])
def test_prompts_are_deterministic_and_correct(digits):
    task = AdditionTask(digits=digits)
    rng = torch.get_rng_state()
    p = task.prompts(300, seed=5)
    assert torch.equal(torch.get_rng_state(), rng)  # local generator only
    q = task.prompts(300, seed=5)
    r = task.prompts(300, seed=6)
    fields = ("prompt_ids", "answer_ids", "a", "b")
    assert all(torch.equal(getattr(p, f), getattr(q, f)) for f in fields)
    assert not torch.equal(p.prompt_ids, r.prompt_ids)
    assert p.prompt_ids.shape == (300, 2 * digits + 3) and p.answer_ids.shape == (300, digits + 2)
    assert p.prompt_ids.dtype == p.answer_ids.dtype == torch.long
    assert ((p.a >= 0) & (p.a < 10**digits) & (p.b >= 0) & (p.b < 10**digits)).all()
    # reading the digits back (least significant first) gives a, b and a + b
    value = lambda ids: ((ids - 5) * 10 ** torch.arange(ids.shape[1])).sum(1)  # noqa: E731
    assert torch.equal(value(p.prompt_ids[:, 1 : 1 + digits]), p.a)
    assert torch.equal(value(p.prompt_ids[:, digits + 2 : 2 * digits + 2]), p.b)
    assert torch.equal(value(p.answer_ids[:, :-1]), p.a + p.b)
    assert (p.answer_ids[:, -1] == EOS).all()
    assert len(p) == 300


def test_repeat_interleave_groups_rows():
    p = AdditionTask(digits=2).make([1, 2], [3, 4]).repeat_interleave(3)
    assert p.a.tolist() == [1, 1, 1, 2, 2, 2] and decode(p.answer_ids[4]) == "600$"


# answer of 7 + 95 with digits=3 is "2010$" (the prompt "^700+590=")
@pytest.mark.parametrize(
    "completion, reward",
    [
        ("2010$", 1.0),
        ("2010$777", 1.0),  # anything after EOS is ignored
        ("2010$$[17]", 1.0),
        ("2010", 0.5),  # right digits without EOS: partial only
        ("20107$", 0.5),  # an extra digit where EOS belongs
        ("2011$", 0.375),  # 3 of 4 digit positions
        ("2$", 0.125),  # EOS too early: later positions count as wrong
        ("2$10$", 0.125),  # digits after the first EOS do not count
        ("[17][17]10$", 0.25),
        ("0102$", 0.0),  # written order instead of reversed: no position right
        ("", 0.0),
        ("$", 0.0),
        ("_____", 0.0),
        ("99999999", 0.0),
    ],
)
def test_reward_cases(completion, reward):
    task = AdditionTask(digits=3)
    p = task.make([7], [95])
    got = task.reward(p, torch.tensor([encode(completion)], dtype=torch.long).reshape(1, -1))
    assert got.dtype == torch.float32 and got.tolist() == [reward]


def test_reward_is_vectorised_over_the_batch():
    task = AdditionTask(digits=2)
    p = task.make([12, 50, 99, 0], [34, 50, 1, 0])  # sums 46, 100, 100, 0 → answers "640$", "001$", "001$", "000$"
    rows = ["640$", "001", "9$", "[15]00$"]
    c = torch.tensor([(encode(r) + [PAD] * 8)[:8] for r in rows], dtype=torch.long)
    assert task.reward(p, c).tolist() == pytest.approx([1.0, 0.5, 0.0, 0.5 * 2 / 3], abs=1e-7)
    assert task.reward(p, p.answer_ids).tolist() == [1.0] * 4


@pytest.mark.parametrize(
    "completion, fragment",
    [
        (torch.zeros(3, 4, dtype=torch.long), r"completion_ids must have shape \[2, L\], got \(3, 4\)"),
        (torch.zeros(2, dtype=torch.long), r"must have shape \[2, L\]"),
        (torch.zeros(2, 4), "must be integer token ids"),
    ],
)
def test_reward_rejects_bad_completions(completion, fragment):
    task = AdditionTask(digits=2)
    with pytest.raises(ValueError, match=fragment):
        task.reward(task.make([1, 2], [3, 4]), completion)


def test_reward_rejects_prompts_of_another_task():
    with pytest.raises(ValueError, match="answers of length 4, but this task's answers have 5"):
        AdditionTask(digits=3).reward(AdditionTask(digits=2).make([1], [2]), torch.zeros(1, 5, dtype=torch.long))


def test_train_and_eval_splits_are_disjoint():
    task = AdditionTask(digits=2)
    a = torch.arange(100).repeat_interleave(100)
    b = torch.arange(100).repeat(100)
    held_out = task.is_eval_pair(a, b)
    assert int(held_out.sum()) == 1016  # ≈ eval_fraction = 0.1 of the 10 000 pairs, fixed by the hash
    eval_pairs = {(x, y) for x, y, e in zip(a.tolist(), b.tolist(), held_out.tolist()) if e}
    train = [task.prompts(4000, seed=s, split="train") for s in range(3)]
    ev = [task.prompts(4000, seed=s, split="eval") for s in range(3)]
    seen_train = {(x, y) for p in train for x, y in zip(p.a.tolist(), p.b.tolist())}
    seen_eval = {(x, y) for p in ev for x, y in zip(p.a.tolist(), p.b.tolist())}
    assert seen_eval <= eval_pairs and not (seen_train & eval_pairs)
    assert len(seen_eval) > 0.9 * len(eval_pairs)  # the eval draws cover the held-out set
    assert len(seen_train) > 0.65 * (10_000 - 1016)  # 12 000 draws with replacement cover ≈ 74 %


@pytest.mark.parametrize("digits, fraction", [(3, 0.1), (3, 0.25), (4, 0.1), (6, 0.02)])
def test_eval_fraction_is_respected(digits, fraction):
    task = AdditionTask(digits=digits, eval_fraction=fraction)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 10**digits, (200_000,), generator=g)
    b = torch.randint(0, 10**digits, (200_000,), generator=g)
    assert abs(task.is_eval_pair(a, b).float().mean().item() - fraction) < 0.005


def test_empty_split_is_an_error():
    task = AdditionTask(digits=1, eval_fraction=0.001)
    msg = "the eval split of 1-digit addition with eval_fraction=0.001 holds no operand pairs"
    with pytest.raises(ValueError, match=msg):
        task.prompts(4, seed=0, split="eval")


@pytest.mark.parametrize(
    "kwargs, fragment",
    [({"digits": 0}, "digits"), ({"digits": 10}, "digits"), ({"eval_fraction": 0.9}, "eval_fraction"),
     ({"dig": 3}, "dig"), ({"reverse_operands": "sideways"}, "reverse_operands")],
)
def test_task_validation(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        AdditionTask(**kwargs)


def test_prompts_argument_errors():
    task = AdditionTask()
    with pytest.raises(ValueError, match="split must be 'train' or 'eval', got 'test'"):
        task.prompts(4, seed=0, split="test")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be at least 1"):
        task.prompts(0, seed=0)


def test_prompts_type():
    assert isinstance(AdditionTask().prompts(2, 0), Prompts)
