"""An env listed in a manifest writes its id, tags and description there once: the decorator
leaves them out and the catalog's spec gives them to the env when it is made."""

from __future__ import annotations

import pytest

import corral as cr
from corral.catalog import EnvSpec, default_catalog
from corral.errors import AuthoringError
from corral.registry import Catalog


@cr.environment(tasks=[{"word": "hi"}], max_turns=1)
class Listed(cr.TextEnv):
    """Repeat a word (the class's own docstring, not the manifest's description)."""

    def instruction(self, task: cr.Task) -> str:
        return f"say {task.word}"


def test_an_id_less_env_takes_id_and_tags_from_its_spec() -> None:
    catalog = Catalog(entry_points=False)
    catalog.register("acme/listed-v1", "tests.sdk.test_manifest_source:Listed",
                     tags=["text", "echo"], description="Repeat a word.",
                     source="manifest:acme/corral.toml")
    assert Listed.env_id is None and "acme/listed-v1" not in default_catalog  # nothing registered
    env = catalog.make("acme/listed-v1")
    assert env.env_id == "acme/listed-v1" and env.tags == ("text", "echo")
    assert Listed.env_id is None and Listed.tags == ()  # the class serves whatever lists it
    spec = catalog.spec("acme/listed-v1")
    assert spec.description == "Repeat a word." and spec.tags == ["text", "echo"]


def test_the_manifest_wins_over_a_decorator_that_repeats_itself() -> None:
    """A module still naming its id in the decorator fills the manifest's entry in; the
    manifest's tags and description stay the env's."""
    catalog = Catalog(entry_points=False)
    catalog.register("acme/both-v1", "m:Both", tags=["from-manifest"], description="Manifest.",
                     source="manifest:acme/corral.toml")

    class Both(cr.TextEnv):
        """From the docstring."""

    Both.__module__, Both.__qualname__ = "m", "Both"  # the class the entry point names
    spec = catalog.register("acme/both-v1", Both, tags=["from-code"], description="Code.")
    assert spec.loaded and spec.tags == ["from-manifest"] and spec.description == "Manifest."


def test_bare_decorator_and_registration_arguments_without_an_id() -> None:
    @cr.environment
    class Bare(cr.TextEnv):
        tasks = cr.Dataset.from_list([{"n": 1}])

    assert Bare.env_id is None and len(Bare.tasks) == 1
    with pytest.raises(AuthoringError, match="description, override describe a registration"):
        cr.environment(tasks=[{"n": 1}], description="x", override=True)
    # a single-file env with no manifest still names its id in the decorator
    @cr.environment("acme/single-file-v1", tasks=[{"n": 1}], tags=["demo"], register=False)
    class Single(cr.TextEnv):
        pass

    made = EnvSpec("acme/single-file-v1", Single).make()
    assert Single.env_id == made.env_id == "acme/single-file-v1" and made.tags == ("demo",)


def test_built_in_envs_name_no_id_in_code() -> None:
    """The 28 built-in env classes are listed in their manifests, which alone name them."""
    import importlib

    from corral.envs import manifest_specs

    listed = [e for e in manifest_specs() if not e["kwargs"]]
    assert len(listed) >= 28
    for entry in listed:
        module, _, attr = entry["entry_point"].partition(":")
        cls = getattr(importlib.import_module(module), attr)
        assert cls.env_id is None, entry["id"]
    env = cr.make("corral/word-sort-v0")
    assert env.env_id == "corral/word-sort-v0" and env.tags == ("text", "strings", "single-turn")
