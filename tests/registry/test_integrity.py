"""Releases are what they claim: tasks files resolve in the env's folder, installed files are
re-hashed before they run, and code cannot silently shadow a built-in or installed env."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import corral as cr
from corral.catalog import Catalog, EnvSpec
from corral.errors import DuplicateRegistration
from corral.registry.errors import ReleaseError
from corral.registry.install import install
from corral.registry.store import LocalStore
from corral.registry.transfer import publish
from corral.registry.verify import InstallGuard, check_install, verify_installs


def test_relative_tasks_file_resolves_in_the_env_folder_not_the_cwd(tmp_path: Path) -> None:
    env_dir, elsewhere = tmp_path / "env", tmp_path / "elsewhere"
    env_dir.mkdir()
    elsewhere.mkdir()
    (env_dir / "tasks.jsonl").write_text('{"word": "from-the-env-folder"}\n')
    (elsewhere / "tasks.jsonl").write_text('{"word": "from-the-cwd"}\n')
    (env_dir / "relenv.py").write_text(textwrap.dedent('''
        import corral as cr

        @cr.environment("reltest/by-path-v0", tasks="tasks.jsonl")
        def by_path(task):
            return task.word

        @cr.environment("reltest/by-dataset-v0", tasks=cr.Dataset.from_jsonl("tasks.jsonl"))
        def by_dataset(task):
            return task.word
    '''))
    code = ("import sys, corral as cr; sys.path.insert(0, sys.argv[1]); import relenv; "
            "print(cr.make('reltest/by-path-v0').tasks[0].word, "
            "cr.make('reltest/by-dataset-v0').tasks[0].word)")
    out = subprocess.run([sys.executable, "-c", code, str(env_dir)], cwd=elsewhere,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["from-the-env-folder"] * 2


def test_missing_relative_tasks_file_names_the_folder_it_looked_in(tmp_path: Path) -> None:
    with pytest.raises(cr.errors.DatasetError, match=str(tmp_path / "nope.jsonl")):
        cr.Dataset.from_jsonl("nope.jsonl", relative_to=tmp_path)


def test_code_cannot_silently_shadow_a_builtin_env() -> None:
    catalog = Catalog(entry_points=False)
    catalog.add_source(lambda: [EnvSpec("corral/shadow-v0", "pkg.mod:Builtin",
                                                    source="manifest:x/corral.toml")])

    class Mine(cr.TextEnv):
        pass

    # Registered before the catalog read its sources: the conflict surfaces at lookup.
    early = Catalog(entry_points=False)
    early.register("corral/shadow-v0", Mine)
    early.add_source(lambda: [EnvSpec("corral/shadow-v0", "pkg.mod:Builtin",
                                                  source="manifest:x/corral.toml")])
    early.register("corral/other-v0", Mine)  # reading sources happened; other ids are fine
    with pytest.raises(DuplicateRegistration, match="override=True"):
        early.spec("corral/shadow-v0")
    assert early.spec("corral/other-v0").entry_point is Mine

    # Registered after: the conflict is raised at once, and override=True is the way out.
    assert catalog.spec("corral/shadow-v0").entry_point == "pkg.mod:Builtin"
    with pytest.raises(DuplicateRegistration, match="manifest:x/corral.toml"):
        catalog.register("corral/shadow-v0", Mine)
    catalog.register("corral/shadow-v0", Mine, override=True)
    assert catalog.spec("corral/shadow-v0").entry_point is Mine


def test_decorator_shadowing_a_builtin_is_refused_unless_overridden() -> None:
    code = textwrap.dedent('''
        import corral as cr
        from corral.errors import DuplicateRegistration

        try:  # refused where it is written: `import corral` already knows the built-in envs
            @cr.environment("corral/word-sort-v0", tasks=[{"a": 1}])
            def mine(task):
                return "x"
        except DuplicateRegistration:
            print("refused")
        print(type(cr.make("corral/word-sort-v0")).__name__)  # the built-in, untouched

        @cr.environment("corral/countdown-v0", tasks=[{"a": 1}], override=True)
        def replaced(task):
            return "x"

        print(type(cr.make("corral/countdown-v0")).__name__)
    ''')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused", "WordSort", "replaced"]


def test_tampered_install_is_refused_at_make_reported_and_replaced(
        make_env, home: Path) -> None:
    folder, env_id = make_env(4)
    store = LocalStore()
    publish(folder, registry=store)
    catalog = Catalog(entry_points=False)
    catalog.add_guard(InstallGuard())
    installed = install(env_id, store=store, catalog=catalog)
    manifest = installed.record.manifest
    assert check_install(installed.path, manifest).ok

    (installed.path / "helpers.py").write_text("def normalise(text):\n    return 'hacked'\n")
    (installed.path / "sitecustomize.py").write_text("print('planted')\n")
    check = check_install(installed.path, manifest)
    assert check.modified == ["helpers.py"] and check.added == ["sitecustomize.py"]
    with pytest.raises(ReleaseError, match="changed after install"):
        catalog.make(env_id)
    [report] = verify_installs(store)
    assert not report.ok and "helpers.py" in report.problem()

    env = {**os.environ, "CORRAL_HOME": str(home)}
    cli = subprocess.run([sys.executable, "-m", "corral.cli", "verify"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert cli.returncode == 1 and "changed" in cli.stdout + cli.stderr, cli.stdout + cli.stderr

    reinstalled = install(env_id, store=store, catalog=Catalog(entry_points=False))
    assert check_install(reinstalled.path, manifest).ok
    cli = subprocess.run([sys.executable, "-m", "corral.cli", "verify"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert cli.returncode == 0 and "1 installed release(s) verified" in cli.stdout, cli.stderr
