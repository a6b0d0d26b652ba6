"""Curation: difficulty profiles from real episodes, near-duplicate detection within and across
envs, and reproducible weighted mixtures filtered by difficulty and tags."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import corral as cr
from corral.errors import RegistryError
from corral.registry import Catalog
from corral.registry.curation import find_near_duplicates, mix, profile_env
from corral.registry.minhash import MinHasher, jaccard, shingles
from corral.registry.store import LocalStore


class Sums(cr.TextEnv):
    """Add two numbers (the even tasks are easy: the answer is in the prompt)."""

    tasks = cr.Dataset.from_list([{"a": i, "b": i + 1} for i in range(40)])

    def instruction(self, task):
        hint = f" (it is {task.a + task.b})" if task.a % 2 == 0 else ""
        return f"What is {task.a} plus {task.b}?{hint}"

    @cr.reward
    def correct(self, task, completion):
        return float(completion.strip() == str(task.a + task.b))

    def solution(self, task):
        return str(task.a + task.b)

    def random_action(self, task, rng):
        return str(task.a + task.b) if task.a % 2 == 0 else "0"


def _catalog() -> Catalog:
    catalog = Catalog(entry_points=False)
    catalog.register("mixlab/sums-v1", Sums, tags=["math", "text"])
    catalog.register("mixlab/sums-v2", Sums, tags=["math"])
    catalog.register("other/sums-v1", Sums, tags=["text"])
    return catalog


async def test_profile_records_pass_rates(tmp_path: Path) -> None:
    store, catalog = LocalStore(tmp_path / "s"), _catalog()
    random_profile = await profile_env("mixlab/sums-v1", "random", n=20, runs=2, store=store,
                                       catalog=catalog)
    assert len(random_profile.tasks) == 20 and all(t.runs == 2 for t in random_profile.tasks)
    assert {t.task_index: t.pass_rate for t in random_profile.tasks} == \
        {i: float(i % 2 == 0) for i in range(20)}
    assert random_profile.histogram(10) == [10, 0, 0, 0, 0, 0, 0, 0, 0, 10]
    oracle = await profile_env("mixlab/sums-v1", "oracle", n=None, store=store, catalog=catalog)
    assert oracle.pass_rate == 1.0 and len(oracle.tasks) == 40
    assert store.profile("mixlab/sums-v1", "random").pass_rate == 0.5
    assert store.profile_agents("mixlab/sums-v1") == ["oracle", "random"]


def test_minhash_estimates_jaccard() -> None:
    a = shingles("the quick brown fox jumps over the lazy dog near the river bank today")
    b = shingles("the quick brown fox jumps over the lazy cat near the river bank today")
    hasher = MinHasher(256, seed=1)
    estimate = (hasher.signature(a) == hasher.signature(b)).mean()
    assert abs(estimate - jaccard(a, b)) < 0.1


def test_operators_are_tokens_so_different_sums_are_not_duplicates() -> None:
    """corral/arithmetic-v0 had 50,087 pairs such as "Compute 9 * 10" / "Compute 9 - 10" at
    similarity 1.00: `\\w+` dropped the operator. Operators and punctuation are tokens now."""
    times, minus = (shingles(f"Compute 9 {op} 10. Reply with the number only.") for op in "*-")
    assert jaccard(times, minus) < 0.8
    catalog = Catalog(entry_points=False)
    catalog.register("ops/sums-v1", type("Ops", (cr.TextEnv,), {"tasks": cr.Dataset.from_list(
        [{"prompt": f"Compute 9 {op} 10. Reply with the number only."} for op in "*-+*"])}))
    pairs = find_near_duplicates(["ops/*"], threshold=0.8, catalog=catalog)
    assert [(p.a.index, p.b.index, p.similarity) for p in pairs] == [(0, 3, 1.0)]


def test_near_duplicates_within_and_across_envs() -> None:
    base = [f"Write a haiku about {w} in the style of a weather report for sailors at dawn"
            for w in ("rain", "snow", "fog", "wind", "hail", "frost")]
    unique = ["Sort these numbers ascending: 4 8 1", "Name three prime numbers below twenty",
              "Translate 'good morning' into French", "Reverse the string corral"]

    def env_class(prompts: list[str]) -> type:
        class Prompts(cr.TextEnv):
            tasks = cr.Dataset.from_list([{"prompt": p} for p in prompts])
        return Prompts

    catalog = Catalog(entry_points=False)
    # env a: its tasks 0 and 1 are the same text but for one trailing word
    catalog.register("dup/a-v1", env_class([base[0], base[0] + " please", *unique[:2]]))
    # env b holds a copy of a's task 2 and a new near-copy of base[0]
    catalog.register("dup/b-v1", env_class([unique[1], base[0].replace("dawn", "dusk"),
                                            unique[3]]))
    pairs = find_near_duplicates(["dup/*"], threshold=0.7, catalog=catalog)
    found = {(p.a.env_id, p.a.index, p.b.env_id, p.b.index) for p in pairs}
    assert found == {("dup/a-v1", 0, "dup/a-v1", 1), ("dup/a-v1", 0, "dup/b-v1", 1),
                     ("dup/a-v1", 1, "dup/b-v1", 1), ("dup/a-v1", 3, "dup/b-v1", 0)}
    exact = [p for p in pairs if p.a.index == 3]
    assert exact[0].similarity == 1.0 and exact[0].across_envs
    assert all(p.similarity >= 0.7 for p in pairs)


async def test_mix_is_weighted_filtered_and_reproducible(tmp_path: Path) -> None:
    store, catalog = LocalStore(tmp_path / "s"), _catalog()
    mixture = mix({"mixlab/*": 1.0, "other/sums-v1": 2.0}, seed=7, catalog=catalog)
    assert mixture.weights == pytest.approx({"mixlab/sums-v1": 1 / 6, "mixlab/sums-v2": 1 / 6,
                                             "other/sums-v1": 2 / 3})
    draws = mixture.sample(3000)
    assert draws == mixture.sample(3000)  # same seed, same stream
    assert draws != mix({"mixlab/*": 1.0, "other/sums-v1": 2.0}, seed=8,
                        catalog=catalog).sample(3000)
    share = Counter(d.env_id for d in draws)
    assert abs(share["other/sums-v1"] / 3000 - 2 / 3) < 0.04
    assert all(0 <= d.task_index < 40 for d in draws)
    assert mixture.task(draws[0]).a == draws[0].task_index

    tagged = mix({"*": 1.0}, filter={"tags": ["text"]}, catalog=catalog)
    assert set(tagged.weights) == {"mixlab/sums-v1", "other/sums-v1"}

    with pytest.raises(RegistryError, match="no difficulty profile"):
        mix({"mixlab/sums-v1": 1}, filter={"difficulty": (0.5, 1.0)}, store=store,
            catalog=catalog)
    await profile_env("mixlab/sums-v1", "random", n=30, store=store, catalog=catalog)
    hard = mix({"mixlab/sums-v1": 1}, filter={"difficulty": (0.5, 1.0), "agent": "random"},
               store=store, catalog=catalog, seed=3)
    assert {d.task_index % 2 for d in hard.sample(200)} == {1}  # only the odd (hard) tasks
    assert hard.describe() == [{"env_id": "mixlab/sums-v1", "weight": 1.0, "tasks": 15}]
    small = mix({"mixlab/sums-v1": 1}, filter=lambda env_id, task: task.a < 5, catalog=catalog)
    assert {d.task_index for d in small.sample(100)} == set(range(5))
    with pytest.raises(RegistryError, match="no environment matches"):
        mix({"nobody/*": 1.0}, catalog=catalog)
    assert cr.mix is mix
