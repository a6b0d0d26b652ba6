"""Corral envs through Gymnasium's own API: its registry (`gymnasium.make`), `env.spec`,
`gymnasium.make_vec` with sync and async (fork and spawn, shared memory on and off) vector
envs, and `check_env` without a warning."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import gymnasium
import pytest
from gymnasium.envs.registration import EnvSpec as GymnasiumSpec
from gymnasium.utils.env_checker import check_env

import corral as cr
from corral.catalog import GymEntry, default_catalog

TEXT_ENVS = [spec.id for spec in default_catalog.list() if spec.kind == "text"
             and spec.id.startswith("corral/") and not spec.id.startswith("corral/rg-")]


def checked_without_warnings(env: gymnasium.Env) -> None:
    """Gymnasium's `check_env` on `env`, failing on any warning it gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    env.close()
    assert not [str(w.message) for w in caught], env.spec


def test_gymnasium_make_after_import_corral_in_a_fresh_interpreter() -> None:
    code = """
import corral, gymnasium
from corral.catalog import default_catalog
ids = {s.id for s in default_catalog.list()}
assert ids and ids <= set(gymnasium.registry), ids - set(gymnasium.registry)
env = gymnasium.make("corral/arithmetic-v0")
obs, info = env.reset(seed=0)
assert isinstance(obs, str) and obs and env.spec.id == "corral/arithmetic-v0", env.spec
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_code_registrations_join_and_leave_gymnasiums_registry() -> None:
    @cr.environment("gymtest/echo-v0", tasks=[{"word": "moo"}])
    def echo(task):
        return f"Say {task.word}."

    @echo.reward
    def said(task, completion):
        return completion.strip() == task.word

    try:
        env = gymnasium.make("gymtest/echo-v0")
        assert env.reset(seed=1)[0] == "Say moo."
        assert env.step("moo")[1:3] == (1.0, True)
        assert isinstance(gymnasium.spec("gymtest/echo-v0").entry_point, GymEntry)
    finally:
        default_catalog.unregister("gymtest/echo-v0")
    assert "gymtest/echo-v0" not in gymnasium.registry


def test_catalog_make_gives_a_gymnasium_spec_that_remakes_the_env() -> None:
    env = cr.make("corral/word-sort-v0", max_turns=3)
    assert isinstance(env.spec, GymnasiumSpec) and env.spec.kwargs == {"max_turns": 3}
    again = env.spec.make()  # what check_env does for each render mode
    assert again.unwrapped.max_turns == 3 and again.spec.id == "corral/word-sort-v0"
    # a worker process receives the entry point as the id alone
    assert pickle.loads(pickle.dumps(env.spec.entry_point)) == GymEntry("corral/word-sort-v0")


@pytest.mark.parametrize("env_id", TEXT_ENVS)
def test_check_env_passes_without_warnings_on_built_in_text_envs(env_id: str) -> None:
    checked_without_warnings(cr.make(env_id))
    checked_without_warnings(gymnasium.make(env_id).unwrapped)


def test_check_env_passes_on_a_terminal_and_a_browser_env(base_image: str) -> None:
    checked_without_warnings(cr.make("corral/term-text-v0"))
    checked_without_warnings(cr.make("corral/web-click-button-v0"))


VECTOR_SCRIPT = """
import sys
import gymnasium
import corral

def main():
    context, shared = sys.argv[1], sys.argv[2] == "shm"
    kwargs = {"shared_memory": shared, **({"context": context} if context != "default" else {})}
    # the parent resets one first: its sync loop is running when the workers fork
    corral.catalog.make("corral/guess-number-v0").reset(seed=0)
    envs = gymnasium.make_vec("corral/guess-number-v0", 2, vectorization_mode="async",
                              vector_kwargs=kwargs)
    single = [corral.catalog.make("corral/guess-number-v0") for _ in range(2)]
    obs, _ = envs.reset(seed=[3, 4])
    assert list(obs) == [e.reset(seed=s)[0] for e, s in zip(single, [3, 4])], obs
    obs, reward, terminated, truncated, _ = envs.step(["50", "éè 50 ✓"])
    assert list(obs) == [e.step(a)[0] for e, a in zip(single, ["50", "éè 50 ✓"])], obs
    assert all(o and o != "a" * len(o) for o in obs), obs
    envs.close()
    print("ok", obs[0][:40])

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("context,memory", [("default", "shm"), ("spawn", "shm")])
def test_async_vector_envs_fork_and_spawn(tmp_path: Path, context: str, memory: str) -> None:
    """The default (fork) context no longer hangs at reset when the parent's sync loop runs;
    spawn with shared memory no longer reads every observation as 'aaaa...'."""
    script = tmp_path / "vec.py"
    script.write_text(textwrap.dedent(VECTOR_SCRIPT))
    out = subprocess.run([sys.executable, str(script), context, memory], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]


def test_sync_vector_env() -> None:
    envs = gymnasium.make_vec("corral/arithmetic-v0", 3, vectorization_mode="sync")
    obs, info = envs.reset(seed=0)
    assert len(obs) == 3 and all(o.startswith("Compute") for o in obs)
    _, reward, terminated, _, info = envs.step(["0", "1", "2"])
    assert terminated.all() and set(info["rewards"]["correct"]) <= {0.0, 1.0}
    envs.close()
