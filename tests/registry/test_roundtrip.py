"""Round trip through the command line: publish a built-in env to a live registry, pull it into
a clean store, install it, then `make` and validate it in a fresh process; hashes match."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import corral.envs
from corral.registry.store import LocalStore
from registry_helpers import CORRAL_TOKEN

ENV_ID = "corral/word-sort-v0"
BUILTIN = Path(corral.envs.__file__).parent / "text"


def corral(*args: str, home: Path, cwd: Path) -> str:
    env = {**os.environ, "CORRAL_HOME": str(home)}
    env.pop("CORRAL_REGISTRY", None)
    env.pop("CORRAL_LOCK", None)
    out = subprocess.run([sys.executable, "-c", "from corral.cli import main; main()", *args],
                         capture_output=True, text=True, env=env, cwd=cwd, timeout=240)
    assert out.returncode == 0, f"corral {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.mark.slow
def test_publish_pull_install_make_validate(server, tmp_path: Path) -> None:
    home = tmp_path / "clean-home"
    cli = lambda *a: corral(*a, home=home, cwd=tmp_path)  # noqa: E731
    out = cli("publish", str(BUILTIN), "--id", ENV_ID, "--version", "1.0.0", "--registry",
              server.url, "--token", CORRAL_TOKEN, "--validate", "--validate-limit", "6")
    published = server.store.resolve(ENV_ID)
    assert published.sha256 in out and published.manifest.validation["ok"]
    assert published.manifest.card.tasks == 100_000

    cli("pull", ENV_ID, "--registry", server.url)
    local = LocalStore(home)
    pulled = local.resolve(ENV_ID)
    assert pulled.sha256 == published.sha256
    assert hashlib.sha256(local.archive(pulled.sha256).read_bytes()).hexdigest() == \
        published.sha256

    cli("install", f"{ENV_ID}@1.0.0")
    [row] = local.installs()
    installed = Path(row["path"])
    for rel, entry in published.manifest.files.items():
        data = (installed / rel).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry.sha256
        assert data == (BUILTIN / rel).read_bytes()

    cli("lock", ENV_ID, "--output", str(tmp_path / "corral.lock"))
    probe = ("import corral as cr; env = cr.make('corral/word-sort-v0'); "
             "spec = cr.spec('corral/word-sort-v0'); "
             "print(type(env).__module__, spec.metadata['release']['sha256'])")
    env = {**os.environ, "CORRAL_HOME": str(home), "CORRAL_LOCK": str(tmp_path / "corral.lock")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.split()
    assert out == [row["module"] + ".words", published.sha256]  # the release's code, pinned

    report = tmp_path / "validation.json"
    cli("validate", ENV_ID, "--limit", "8", "--json", str(report))
    data = json.loads(report.read_text())
    assert data["ok"] and data["tasks_checked"] == 8 and data["oracle_pass_rate"] == 1.0
