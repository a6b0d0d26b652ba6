"""Releases hold what they should (`.corralignore`, the publisher's paths kept out, every task
field with its type, the held-out split named "eval"), and `corral info` of an installed,
profiled env shows its dataset card."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from corral.cli import app
from corral.registry.build import build_release
from corral.registry.curation import profile_env
from corral.registry.install import install
from corral.registry.store import LocalStore


def _litter(folder: Path) -> None:
    """What running, validating and trying an env leaves in its folder."""
    for rel, text in {"runs/r1/trajectories.jsonl": "{}\n", "validation/acme.json": "{}",
                      "debug.log": "x", "sub/deep.log": "x", "scratch.py": "print(1)\n",
                      "notes/todo.txt": "later", "keep.log": "kept", "__pycache__/env.pyc": "",
                      "data/runs/extra.txt": "nested runs/ too"}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    (folder / ".corralignore").write_text("# mine\nscratch.py\n/notes/\n!keep.log\n")


def test_release_leaves_out_what_corralignore_and_the_defaults_say(make_env) -> None:
    folder, env_id = make_env(6, tasks=[{"word": "a", "topic": "t", "n": 1},
                                        {"word": "b", "topic": None, "n": 2},
                                        {"word": "c", "topic": "u"}])
    _litter(folder)
    listed: list[str] = []
    built = build_release(folder, on_files=lambda files: listed.extend(files))
    files = set(built.manifest.files)
    assert files == {".corralignore", "Dockerfile", "corral.toml", "env.py", "helpers.py",
                     "keep.log", "tasks.jsonl"}
    assert listed == sorted(files)
    card = built.manifest.card
    # the publisher's absolute paths stay home
    assert card.provenance["dataset_source"] == "tasks.jsonl" and card.source == "tasks.jsonl"
    assert str(folder) not in built.manifest.to_json().decode()
    # every field of every task, with its types
    assert card.fields == {"n": "int | missing", "topic": "null | str", "word": "str"}
    # the held-out split's one name is "eval"; this dataset declares none
    assert card.splits == {"train": 3} and card.split_rule == "no eval split declared"


def test_an_eval_split_is_named_eval_on_the_card(make_env) -> None:
    extra = "\nEcho.tasks = Echo.tasks.held_out(0.5)\n"
    folder, _ = make_env(40, extra=extra)
    card = build_release(folder).manifest.card
    assert set(card.splits) == {"train", "eval"} and sum(card.splits.values()) == 40
    assert 0 < card.splits["eval"] < 40 and card.split_rule.startswith("held_out(0.5)")


def test_info_shows_the_card_of_an_installed_profiled_env(home: Path, make_env) -> None:
    folder, env_id = make_env(5)
    store = LocalStore(home)
    store.publish(build_release(folder, validate_limit=0).archive)
    install(env_id, store=store)
    asyncio.run(profile_env(env_id, "oracle", store=store))
    out = CliRunner().invoke(app, ["info", env_id], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert f"release: {env_id}@1.0.0 sha256:" in out.output
    assert any(line.startswith("validation: OK: oracle 100% pass, no-op 0% pass over 5 task(s)")
               for line in lines), out.output
    assert "splits: train 5 (no eval split declared)" in lines
    assert "fields: topic str, word str" in lines
    assert "pass rates agent oracle: pass@1 100% over 5 task(s)" in lines
    data = json.loads(CliRunner().invoke(app, ["info", env_id, "--json"]).output)
    assert data["release"]["version"] == "1.0.0" and data["release"]["profiles"]


def test_web_page_shows_typed_fields_relative_source_and_the_token_hint(home: Path,
                                                                        make_env) -> None:
    from corral.registry.web import env_page

    folder, env_id = make_env(3)
    store = LocalStore(home)
    store.publish(build_release(folder).archive)
    page = env_page(store, env_id, None, "http://registry:8080")
    assert "<code>topic</code> str, <code>word</code> str" in page
    assert f"corral profile {env_id} --model MODEL --registry http://registry:8080 " \
           "--token TOKEN" in page
    assert str(folder) not in page and "train 3" in page
