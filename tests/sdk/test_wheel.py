"""The wheel installs into a fresh venv and every subpackage imports from it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installs_and_imports_every_subpackage(tmp_path: Path) -> None:
    # Build from a copy of what git tracks (and new files it does not ignore), so no build/
    # folder is left in (or reused from) the working tree and no venv is copied.
    source = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not one deleted from the working tree
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("corral-*.whl"))
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)],
                           capture_output=True, text=True, check=True).stdout
    for top in ("sdk/", "registry/", "runner/", "trainer/", "envs/", "cli/", "integrations/"):
        assert f"\n{top}" not in names, f"wheel ships a top-level {top}"
    assert "corral/envs/text/corral.toml" in names

    target = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(target)
    python = target / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   capture_output=True)
    # Dependencies come from this interpreter's site-packages (a plain path, so its editable
    # install of corral is not active there); corral itself must come from the wheel.
    deps = sysconfig.get_paths()["purelib"]
    site = next((target / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(deps + "\n")
    code = ("import corral, corral.registry, corral.runner, corral.trainer, corral.envs, "
            "corral.envs.text.arithmetic, corral.sandbox, corral.cli, corral.integrations.trl; "
            "print(corral.__file__); import corral as cr; print(cr.make('corral/arithmetic').kind)")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    file_line, kind = out.stdout.split()
    assert file_line.startswith(str(target)) and kind == "text"
