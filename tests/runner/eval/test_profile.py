"""Curation with a real policy: `corral profile ENV --model tiny` records per-task pass rates
(pass@k, avg@k, k, the model, the date) for a release on a live registry server; the release's
dataset card and web page show them; `cr.mix` and `corral train` keep a difficulty band."""

from __future__ import annotations

import json
import time
from typing import Any, Iterator

import httpx
import pytest

import corral as cr
from corral.cli.common import import_user_modules
from corral.errors import CorralError
from corral.registry import dataset_card
from corral.registry.client import RegistryClient
from corral.registry.server import Tokens
from corral.registry.store import LocalStore
from corral.registry.transfer import publish
from corral.trainer.loop import TrainConfig, train
from eval_helpers import corral
from length_envs import SOURCE, TASKS

from registry_helpers import LiveServer  # tests/support

ENV = "evalweb/lengths-v0"
TOKEN = "test-token-evalweb-0001"
BAND = (0.05, 0.95)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A release of the lengths env on a live registry, profiled by the CLI under `tiny`
    (4 samples of each of its 6 tasks)."""
    root = tmp_path_factory.mktemp("profile")
    folder = root / "lengths"
    folder.mkdir()
    (folder / "corral.toml").write_text(
        f'license = "CC-BY-4.0"\n\n[[env]]\nid = "{ENV}"\nentry_point = "env:lengths"\n'
        'kind = "text"\ndescription = "Say anything of the right length."\n'
        'version = "1.0.0"\n')
    (folder / "env.py").write_text(SOURCE.format(env_id=ENV, tasks=TASKS))
    tokens = Tokens.parse([f"evalweb:{TOKEN}"])
    with LiveServer(LocalStore(root / "server-store"), tokens) as server:
        release = publish(folder, registry=server.url, token=TOKEN).record
        started = time.time()
        out = corral("-i", str(folder / "env.py"), "profile", ENV, "--model", "tiny", "-k", "4",
                     "-n", str(TASKS), "--max-tokens", "8", "--registry", server.url,
                     "--token", TOKEN, "--run-dir", str(root / "run"), timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "model tiny: pass@1" in out.stdout and "pass@4" in out.stdout
        import_user_modules([str(folder / "env.py")])  # the env in this process too
        yield {"url": server.url, "release": release, "started": started, "root": root,
               "summary": json.loads((root / "run" / "eval.json").read_text())}


def _profile(card: dict[str, Any]) -> dict[str, Any]:
    [profile] = card["profiles"]
    return profile


def _band_ids(profile: dict[str, Any]) -> set[str]:
    return {t["task_id"] for t in profile["per_task"] if BAND[0] <= t["pass_rate"] <= BAND[1]}


def test_the_card_holds_the_models_pass_rates(profiled):
    card = dataset_card(RegistryClient(profiled["url"]), ENV)
    assert card == httpx.get(f"{profiled['url']}/api/cards/{ENV}").json()
    assert card["sha256"] == profiled["release"].sha256 and card["tasks"] == TASKS
    profile = _profile(card)
    assert (profile["name"], profile["kind"], profile["k"], profile["split"]) == \
        ("tiny", "model", 4, "train")
    assert profiled["started"] <= profile["updated_at"] <= time.time()
    assert profile["tasks"] == TASKS
    by_index = {t["task_index"]: t for t in profile["per_task"]}
    assert sorted(by_index) == list(range(TASKS))
    # task 0 passes whatever the model says, the last task never does
    assert (by_index[0]["pass_rate"], by_index[0]["pass_at_k"], by_index[0]["avg"]) == (1, 1, 1)
    assert (by_index[TASKS - 1]["pass_rate"], by_index[TASKS - 1]["pass_at_k"]) == (0, 0)
    # every figure is the evaluation's own (eval.json of the profile's run directory)
    rows = profiled["summary"]["tasks"]
    for task in profile["per_task"]:
        row = rows[f"{ENV}::{task['task_id']}"]
        assert (task["runs"], task["passes"]) == (row["usable"], row["solved"]) == \
            (4, round(task["pass_rate"] * 4))
        assert task["pass_at_k"] == pytest.approx(row["pass"]["4"])
        assert task["avg"] == pytest.approx(row["avg"])
    assert profile["pass_at_k"] == pytest.approx(profiled["summary"]["overall"]["pass"]["4"])


def test_the_web_page_shows_the_profile(profiled):
    page = httpx.get(f"{profiled['url']}/env/{ENV}")
    assert page.status_code == 200
    html = page.text
    profile = _profile(dataset_card(RegistryClient(profiled["url"]), ENV))
    assert 'data-profile="tiny"' in html and "k = 4" in html and "pass@4" in html
    assert "avg@4" in html and "of the train split" in html
    for task in profile["per_task"]:
        assert task["task_id"] in html
    card_row = html.split('id="card-pass-rates"')[1].split("</td>")[0]
    assert "tiny: pass@1" in card_row and f"{round(100 * profile['pass_rate'])}%" in card_row


def test_mix_keeps_the_tasks_in_the_band(profiled):
    profile = _profile(dataset_card(RegistryClient(profiled["url"]), ENV))
    wanted = sorted(t["task_index"] for t in profile["per_task"]
                    if BAND[0] <= t["pass_rate"] <= BAND[1])
    assert wanted and 0 not in wanted and TASKS - 1 not in wanted
    mixture = cr.mix({ENV: 1.0}, filter={"pass_rate": BAND}, store=profiled["url"])
    [slot] = mixture.slots
    assert sorted(slot.indices) == wanted
    assert {item.task_index for item in mixture.sample(200)} == set(wanted)
    everything = cr.mix({ENV: 1.0}, filter={"pass_rate": (0.0, 1.0)}, store=profiled["url"])
    assert sorted(everything.slots[0].indices) == list(range(TASKS))


async def test_train_skips_tasks_outside_the_band(profiled, tmp_path):
    profile = _profile(dataset_card(RegistryClient(profiled["url"]), ENV))
    config = TrainConfig(envs=[ENV], difficulty=BAND, registry=profiled["url"], steps=1,
                         batch_size=4, group=2, max_tokens=8, run_dir=tmp_path / "run")
    await train(config)
    trained = {json.loads(line)["task_id"]
               for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()}
    assert trained and trained <= _band_ids(profile)
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["splits"][ENV]
    assert record["difficulty"] == {"band": list(BAND), "profile": "tiny", "kind": "model",
                                    "k": 4, "profiled": TASKS,
                                    "kept": len(_band_ids(profile))}
    with pytest.raises(CorralError, match=r"--difficulty: evalweb/lengths-v0 has no "
                                          r"difficulty profile .* under 'nobody'"):
        await train(config.model_copy(update={"difficulty_profile": "nobody",
                                              "run_dir": tmp_path / "other"}))
    # k = 4 samples give pass rates in quarters: none lies in (0.8, 0.9)
    with pytest.raises(CorralError, match=r"--difficulty 0.8:0.9: none of the 6 tasks"):
        await train(config.model_copy(update={"difficulty": (0.8, 0.9),
                                              "run_dir": tmp_path / "third"}))
