"""A real short `corral train` (tiny model, a text env): report.html mid-run and at the end,
utilisation samples, and `--log-to tensorboard --log-to wandb` read back from their files."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from typer.testing import CliRunner

from corral.cli import app
from corral.errors import CorralError
from corral.trainer.sinks import open_sinks

ENVS_FILE = str(Path(__file__).parents[1] / "support" / "train_envs.py")
STEPS = 8
CLI = [sys.executable, "-m", "corral.cli", "-i", ENVS_FILE, "train", "-e", "traintest/digits-v0",
       "--steps", str(STEPS), "--batch", "8", "--group", "4", "--lr", "1e-3", "--max-tokens", "8",
       "--eval-every", "4", "--eval-tasks", "4", "--sft-steps", "2", "--sft-examples", "8",
       "--checkpoint-every", "4"]
TITLE = re.compile(r"<title>Training report: .*step (\d+) of (\d+)</title>")


def _wandb_history(path: Path) -> Iterator[dict[str, Any]]:
    """History rows of an offline W&B run file: W&B's record log (a 7-byte `:W&B` header,
    then LevelDB-style 32 KiB blocks of checksummed chunks) of `wandb_internal_pb2.Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks, block = 7, b"", 32768
    while pos + 7 <= len(data):
        room = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if room < 7 or (length == 0 and kind == 0):  # block padding
            pos += room
            continue
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunks)
            chunks = b""
            if record.WhichOneof("record_type") == "history":
                yield {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.history.item}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, list[tuple[int, str]], str]:
    """One CLI run with both sinks; the report pages seen while it ran (step, html) and what
    it printed."""
    run = tmp_path_factory.mktemp("train") / "run"
    proc = subprocess.Popen([*CLI, "--run-dir", str(run), "--log-to", "tensorboard",
                             "--log-to", "wandb"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: list[tuple[int, str]] = []
    while proc.poll() is None:  # watch the page as a browser left open on it would
        page = run / "report.html"
        if page.exists():
            text = page.read_text()
            match = TITLE.search(text)
            assert match, text[:300]  # atomic writes: never a torn page
            if not seen or seen[-1][0] != int(match.group(1)):
                seen.append((int(match.group(1)), text))
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    return run, seen, out


def test_report_is_written_as_the_run_goes_and_filled_at_the_end(trained) -> None:
    run, seen, _ = trained
    mid = [step for step, _ in seen if step < STEPS]
    assert mid, [s for s, _ in seen]  # the page existed before the last step
    page = (run / "report.html").read_text()
    assert f"step {STEPS} of {STEPS}" in TITLE.search(page).group(0)
    sections = dict(re.findall(r"<h2>(.*?)</h2>\n(.*?)</section>", page, re.S))
    for name in ("Reward", "Loss", "KL and divergence", "Importance weights", "Numerics gap",
                 "Throughput and time to batch", "Utilisation", "Timeline"):
        assert "<polyline" in sections[name] or "<rect" in sections[name], name
    assert "<td>traintest/digits-v0</td>" in sections["Rollouts per env"]
    assert "traintest/digits-v0" in sections["Run"] and "batch_size" in sections["Run"]
    assert 'data-chart="SFT warm-up loss"' in sections["Loss"]  # --sft-steps 2: drawn
    assert 'data-chart="Held-out reward"' in sections["Reward"]  # --eval-every 4: drawn
    assert "the local engine samples from the trainer" in sections["Numerics gap"]
    if not torch.cuda.is_available():
        assert "no CUDA device" in sections["Utilisation"]
    usage = [json.loads(x) for x in (run / "usage.jsonl").read_text().splitlines()]
    assert usage and all(u["cpu_process_pct"] >= 0 and "inflight" in u for u in usage)
    # (no CPU-share floor: samples are 2 s apart and a short run on a quiet machine can fall
    # between them)
    steps = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    assert all(r["reward_by_env"] == {"traintest/digits-v0": pytest.approx(r["reward_mean"])}
               and r["generated_tokens"] > 0 for r in steps)


def test_cli_prints_each_phase_before_the_first_step(trained) -> None:
    """It sat at "0/N starting" for minutes while the model loaded, the warm-up and the
    step-0 evaluation ran: each phase is now a line (with the seconds since the start) even
    where stdout is not a terminal, as here."""
    _, _, out = trained
    lines = re.findall(r"^train +([\d.]+) s  (.+?)\s*$", out, re.M)
    assert [what for _, what in lines] == [
        "preparing the envs", "loading tiny", "starting the local engine",
        "held-out evaluation before the warm-up", "supervised warm-up: 2 steps",
        "held-out evaluation at step 0", "collecting the first batch"], out
    times = [float(t) for t, _ in lines]
    assert times == sorted(times) and times[-1] > times[0], out
    assert f"trained to step {STEPS}" in out


def test_tensorboard_event_files_hold_every_step(trained) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _, _ = trained
    steps = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"reward/batch", "reward/batch/traintest/digits-v0", "train/loss", "sft/loss",
            "reward/held_out", "staleness/divergence_mean", "time/step_s"} <= tags
    rewards = events.Scalars("reward/batch")
    assert [e.step for e in rewards] == list(range(STEPS))
    assert [e.value for e in rewards] == pytest.approx([r["reward_mean"] for r in steps])
    assert len(events.Scalars("sft/loss")) == 2
    assert [e.step for e in events.Scalars("reward/held_out")] == [0, 4, 8]
    assert [e.step for e in events.Scalars("reward/held_out_before_sft")] == [0]


def test_wandb_offline_run_holds_the_metrics(trained) -> None:
    run, _, _ = trained
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    history = list(_wandb_history(files[0]))
    steps = [json.loads(x) for x in (run / "train.jsonl").read_text().splitlines()]
    rl = [h for h in history if "reward/batch" in h]
    assert [h["rl_step"] for h in rl] == list(range(STEPS))
    assert [h["reward/batch"] for h in rl] == pytest.approx([r["reward_mean"] for r in steps])
    assert [h["sft_step"] for h in history if "sft/loss" in h] == [0, 1]
    assert any("reward/held_out" in h for h in history)


def test_missing_sink_package_is_a_one_line_error_naming_the_flag(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if it were not installed
    with pytest.raises(CorralError, match=r"--log-to tensorboard: .*pip install 'corral\[log\]'"):
        open_sinks(["tensorboard"], tmp_path, {})
    script = ("import sys; sys.modules['wandb'] = None; sys.argv[0] = 'corral'; "
              "from corral.cli import main; main()")
    bad = subprocess.run([sys.executable, "-c", script, "-i", ENVS_FILE, "train", "-e",
                          "traintest/digits-v0", "--log-to", "wandb", "--run-dir",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "--log-to wandb" in bad.stderr
    assert not (tmp_path / "run" / "train.jsonl").exists()
    unknown = CliRunner().invoke(app, ["train", "-e", "traintest/digits-v0", "--log-to",
                                       "mlflow", "--run-dir", str(tmp_path / "b")])
    assert unknown.exit_code == 2  # a flag value out of its choices: a usage error
    assert "--log-to mlflow:" in unknown.output  # the bad item, not its list index
    assert "Input should be 'tensorboard' or 'wandb'" in unknown.output
