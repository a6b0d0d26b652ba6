"""The in-process catalog: ids, versions, deprecation, errors, lazy entry points."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import corral as cr
from corral.errors import (DeprecatedEnv, DuplicateRegistration, InvalidEnvId,
                           RegistryError, UnknownEnv)
from corral.registry import Catalog


class Dummy(cr.Env):
    """A stand-in env (`make` refuses anything that is not an Env)."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


class Other:
    pass


@pytest.fixture
def catalog() -> Catalog:
    return Catalog(entry_points=False)


@pytest.mark.parametrize("bad", ["", "noslash", "Acme/x-v1", "acme/", "-x/y-v1", "a/b/c-v1",
                                 "acme/x y-v1"])
def test_malformed_ids(catalog: Catalog, bad: str) -> None:
    with pytest.raises(InvalidEnvId, match="Malformed environment id"):
        catalog.register(bad, Dummy)


def test_versions_resolve_to_latest_and_kwargs_override(catalog: Catalog) -> None:
    catalog.register("acme/task-v1", Dummy, kwargs={"size": 1})
    catalog.register("acme/task-v3", Dummy, kwargs={"size": 3})
    catalog.register("acme/task-v2", Dummy)
    assert catalog.spec("acme/task").id == "acme/task-v3"
    assert catalog.make("acme/task").kwargs == {"size": 3}
    assert catalog.make("acme/task-v1", size=9).kwargs == {"size": 9}


def test_duplicate_registration(catalog: Catalog) -> None:
    catalog.register("acme/task-v1", Dummy)
    catalog.register("acme/task-v1", Dummy)  # the same target again (a re-import) is fine
    with pytest.raises(DuplicateRegistration, match="already registered.*bump the version"):
        catalog.register("acme/task-v1", Other)


def test_deprecation_names_replacement(catalog: Catalog) -> None:
    catalog.register("acme/task-v1", Dummy)
    catalog.register("acme/task-v2", Dummy)
    catalog.deprecate("acme/task-v1", "acme/task-v2")
    with pytest.raises(DeprecatedEnv,
                       match="`acme/task-v1` is deprecated. Please use `acme/task-v2`"):
        catalog.make("acme/task-v1")
    catalog.deprecate("acme/task-v2", "acme/task-v3")
    with pytest.raises(UnknownEnv):  # no live version is left to resolve to
        catalog.spec("acme/task")


def test_unknown_ids_suggest_closest(catalog: Catalog) -> None:
    catalog.register("acme/fix-perms-v1", Dummy)
    with pytest.raises(UnknownEnv, match="Did you mean 'acme/fix-perms-v1'"):
        catalog.spec("acme/fix-prems-v1")
    with pytest.raises(UnknownEnv, match="Registered versions: acme/fix-perms-v1"):
        catalog.spec("acme/fix-perms-v7")
    with pytest.raises(UnknownEnv, match="Namespace `acm` has no environments.*'acme'"):
        catalog.spec("acm/fix-perms-v1")


def test_list_patterns(catalog: Catalog) -> None:
    for i in range(3):
        catalog.register(f"acme/t{i}-v0", Dummy)
    catalog.register("other/t-v0", Dummy)
    assert [s.id for s in catalog.list("acme/*")] == ["acme/t0-v0", "acme/t1-v0", "acme/t2-v0"]
    assert [s.id for s in catalog.list("acme/t1")] == ["acme/t1-v0"]
    assert len(catalog.list()) == 4


def test_builtin_envs_are_lazy() -> None:
    code = textwrap.dedent("""
        import sys, corral as cr
        ids = [s.id for s in cr.registry.list('corral/*')]
        assert 'corral/countdown-v0' in ids, ids
        assert 'corral.envs.text.countdown' not in sys.modules
        cr.make('corral/countdown-v0')
        assert 'corral.envs.text.countdown' in sys.modules
        print('ok')
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_entry_point_group_registers_without_import(tmp_path: Path) -> None:
    """A pip-installed env package: real distribution metadata on sys.path, read lazily."""
    pkg = tmp_path / "acme_envs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import corral as cr
        IMPORTED = True

        @cr.environment("acme/echo-v2", tasks=[{"word": "hi"}], register=False)
        def Echo(task):
            \"\"\"Repeat a word.\"\"\"
            return f"Say {task.word}"
    """))
    dist = tmp_path / "acme_envs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-envs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[corral.envs]\nacme/echo-v2 = acme_envs:Echo\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import corral as cr
        spec = cr.spec('acme/echo')
        assert spec.id == 'acme/echo-v2' and spec.source == 'entry-point:acme-envs', spec
        assert 'acme_envs' not in sys.modules
        env = cr.make('acme/echo-v2')
        assert 'acme_envs' in sys.modules
        print(env.reset(seed=0)[0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Say hi"


def test_default_catalog_functions() -> None:
    assert "corral/arithmetic-v0" in cr.registry.default_catalog
    env = cr.make("corral/arithmetic")
    assert env.env_id == "corral/arithmetic-v0" and env.kind == "text"


def test_a_plain_env_class_learns_its_id(catalog: Catalog) -> None:
    """`register(id, SomeEnv)` without `@cr.environment`: its instances said env_id None."""

    class Plain(cr.Env):
        tasks = cr.Dataset.from_list([{"n": 1}])

        def instruction(self, task: cr.Task) -> str:
            return "say one"

    catalog.register("acme/plain-v1", Plain)
    assert catalog.make("acme/plain-v1").env_id == "acme/plain-v1"
    assert Plain.env_id is None  # the class is not changed: another id may register it too


def test_an_entry_point_that_is_no_env_is_named_at_make(catalog: Catalog) -> None:
    """A factory returning a dict, a class that is not an Env, a constant: an AttributeError
    (`'dict' object has no attribute 'close'`) in `info` and `run` before."""

    def make_dict(**kwargs: object) -> dict[str, str]:
        return {"not": "an env"}

    catalog.register("acme/dict-v1", make_dict)
    catalog.register("acme/other-v1", Other)
    catalog.register("acme/constant-v1", "math:pi")
    where = f"{__name__}:test_an_entry_point_that_is_no_env_is_named_at_make.<locals>.make_dict"
    with pytest.raises(RegistryError) as err:
        catalog.make("acme/dict-v1")
    assert str(err.value) == (f"acme/dict-v1: entry point {where} returned a dict "
                              "({'not': 'an env'}), not an Env")
    with pytest.raises(RegistryError, match=f"acme/other-v1: entry point {__name__}:Other is the "
                       "class Other, which is not an Env subclass"):
        catalog.make("acme/other-v1")
    with pytest.raises(RegistryError, match="acme/constant-v1: entry point math:pi is a float "
                       r"\(3.14"):
        catalog.make("acme/constant-v1")
