"""Built-in text environments: oracles solve every task, scripted non-answers fail, seeds
reproduce, verifiers are exact."""

from __future__ import annotations

import random

import pytest

import corral as cr
from corral.agents import play
from corral.envs.text.answers import final_number
from corral.envs.text.countdown import answer_expression, check, evaluate
from corral.envs.text.guess import NOT_A_GUESS, read_guess

TEXT_ENVS = ["corral/arithmetic-v0", "corral/countdown-v0", "corral/word-sort-v0",
             "corral/guess-number-v0"]


@pytest.mark.parametrize("env_id", TEXT_ENVS)
async def test_oracle_passes_noop_fails(env_id: str) -> None:
    env = cr.make(env_id)
    for index in range(60):
        oracle = await play(env, "oracle", options={"task_index": index})
        assert oracle.passed, (index, oracle)
        noop = await play(env, "noop", options={"task_index": index})
        assert not noop.passed and noop.reward == 0.0


@pytest.mark.parametrize("env_id", TEXT_ENVS)
async def test_random_agent_rarely_solves(env_id: str) -> None:
    env = cr.make(env_id)
    results = [await play(env, "random", seed=s) for s in range(60)]
    assert sum(r.passed for r in results) < 45


def test_tasks_are_reproducible_and_varied() -> None:
    for env_id in TEXT_ENVS:
        a, b = cr.make(env_id).tasks, cr.make(env_id).tasks
        assert [a[i] for i in range(20)] == [b[i] for i in range(20)]
        assert len({a[i].id for i in range(20)}) >= 15  # small games may repeat


def test_countdown_verifier_is_exact() -> None:
    task = cr.make("corral/countdown-v0").tasks.task_type(numbers=[2, 3, 7, 50], target=47,
                                                            reference="50 - 3")
    assert check(task, "50 - 3")
    assert check(task, "(50 - 7) + 2 * 2") is False  # 2 used twice
    assert check(task, "50 - 3 + 0") is False  # 0 is not given
    assert check(task, "__import__('os')") is False
    assert evaluate("7 / 2 * 2")[0] == 7
    with pytest.raises(ValueError):
        evaluate("2 ** 10")


async def test_guess_number_feedback() -> None:
    env = cr.make("corral/guess-number-v0")
    await env.areset(options={"task": {"secret": 37, "high": 100}})
    assert (await env.astep("50"))[0] == "lower"
    assert (await env.astep("Guess: 20"))[0] == "higher"
    assert (await env.astep("no idea"))[0] == NOT_A_GUESS
    obs, reward, terminated, _, info = await env.astep("My guess is 37")
    assert terminated and info["rewards"] == {"solved": 1.0, "efficient": 1.0}
    assert reward == pytest.approx(1.1)


async def test_guess_number_takes_no_integer_in_prose_as_a_guess() -> None:
    """A model that talks about numbers without guessing never wins by accident (it did:
    the last integer of any reply was its guess)."""
    env = cr.make("corral/guess-number-v0")
    await env.areset(options={"task": {"secret": 3, "high": 10}})
    for prose in ("Let me think about numbers 1 to 10. Maybe 3?", "Is it 3?",
                  "I have 8 turns and the answer is between 1 and 3"):
        observation, _, terminated, _, _ = await env.astep(prose)
        assert observation == NOT_A_GUESS and not terminated
    assert [read_guess(r) for r in ("3", " **3**. ", "Guess: 3", "guess = -3", "x")] == [
        3, 3, 3, -3, None]


# Replies a real instruct model writes (SmolLM2-135M-Instruct's among them), and what each
# earns: content is scored as the field's verifiers do, the requested form is paid apart.
NATURAL = [
    ("corral/arithmetic-v0", {"expression": "9 - 6", "answer": 3, "level": 1}, [
        ("3", 1.0, 1.0), ("9 - 6 = 3", 1.0, 0.0), ("**3**", 1.0, 0.0),
        ("The answer is \\boxed{3}.", 1.0, 0.0), ("Answer: 9 - 6 = 3.", 1.0, 0.0),
        ("The result of 9 - 6 is 3. Let me know!", 1.0, 0.0), ("4", 0.0, 1.0),
        ("9 - 6 = 4", 0.0, 0.0), ("I don't know", 0.0, 0.0)]),
    ("corral/arithmetic-v0", {"expression": "12 * 100 - 5", "answer": 1195, "level": 3}, [
        ("1,195", 1.0, 0.0), ("1195.0", 1.0, 0.0), ("x = -1195", 0.0, 0.0)]),
    ("corral/countdown-v0", {"numbers": [5, 3, 2, 25], "target": 16, "reference": "(5+3)*2"}, [
        ("(5 + 3) * 2", 1.0, 1.0), ("(5 + 3) * 2 = 16", 1.0, 0.0), ("16 = (5+3)*2", 1.0, 0.0),
        ("$(5 + 3) \\times 2 = 16$", 1.0, 0.0), ("Answer: (5+3)*2 (which is 8*2)", 1.0, 0.0),
        ("First 5 + 3 = 8, then the expression is (5 + 3) * 2.", 1.0, 0.0),
        ("Step 1: 5 + 3 = 8. Step 2: 8 * 2 = 16", 0.0, 0.0), ("5 * 3", 0.0, 1.0),
        ("(5 + 3) * 2 * 2", 0.0, 1.0), ("16", 0.0, 0.0)]),
    ("corral/word-sort-v0", {"words": ["river", "apple", "stone"], "operation": "sort"}, [
        ("apple river stone", 1.0, 1.0), ("Apple, River, Stone.", 1.0, 0.0),
        ("1. apple\n2. river\n3. stone", 1.0, 0.0),
        ("Sure! Sorting river apple stone alphabetically gives: apple, river, stone", 1.0, 0.0),
        ("stone river apple", 0.0, 1.0), ("apple river", 0.0, 0.0),
        ("apple  river stone", 1.0, 0.0)]),
]


@pytest.mark.parametrize("env_id, task, replies", NATURAL, ids=lambda v: str(v)[:30])
async def test_natural_answers_are_scored_and_the_format_paid_apart(
        env_id: str, task: dict, replies: list) -> None:
    env = cr.make(env_id)
    content = {"corral/arithmetic-v0": "correct", "corral/countdown-v0": "reaches_target",
               "corral/word-sort-v0": "exact"}[env_id]
    for reply, right, formatted in replies:
        await env.areset(options={"task": task})
        _, reward, _, _, info = await env.astep(reply)
        assert info["rewards"] == {content: right, "format": formatted}, reply
        assert reward == pytest.approx(0.8 * right + 0.2 * formatted), reply
        assert env.solved(reward) is bool(right), reply  # solved means the content is right


def test_final_number_and_expression_readers() -> None:
    assert final_number("") is None and final_number("10-3") == 3  # not -3: a binary minus
    assert final_number("<answer>-4</answer> because 4 > 3") == -4
    assert answer_expression("I can't") is None
    assert answer_expression("(using (5+3)*2)") == "(5+3)*2"
    rng = random.Random(0)
    assert final_number(str(rng.randint(0, 9))) is not None
