"""The registry commands behave as docs/registry.md says (found by an acceptance audit)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from corral.catalog import default_catalog
from corral.registry.build import build_release
from corral.registry.install import install
from corral.registry.store import LocalStore


def run_cli(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CORRAL_HOME": str(home)}
    for name in ("CORRAL_REGISTRY", "CORRAL_LOCK", "CORRAL_DEBUG"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-c", "from corral.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=240)


def test_publish_next_version_while_an_older_one_is_installed(home: Path, make_env) -> None:
    """docs/registry.md: publish 1.0.0, install, publish 1.0.1 from the same folder. Packing the
    folder must not clash with the installed release of the same id."""
    folder, env_id = make_env(4)
    first = shutil.copytree(folder, folder.with_name(folder.name + "-copy"))  # not yet imported
    store = LocalStore(home)
    store.publish(build_release(first, version="1.0.0").archive)
    install(f"{env_id}@1.0.0", store=store)
    assert default_catalog.spec(env_id).source.startswith("release:")  # the catalog has read it
    built = build_release(folder, version="1.0.1")  # raised DuplicateRegistration
    assert built.manifest.version == "1.0.1"


def test_bad_references_and_flags_are_one_line_errors(home: Path, make_env, tmp_path: Path
                                                      ) -> None:
    """Each refusal is one `error:` line naming the flag or the reference, exit 1 (2: usage)."""
    folder, env_id = make_env(4)
    LocalStore(home).publish(build_release(folder, version="1.0.0").archive)
    missing = tmp_path / "no-such-store"
    cases = [
        (("yank", env_id), 1, "id@version or sha256:HASH"),  # a bare id yanked the newest
        (("yank", f"{env_id}@"), 1, f"'{env_id}@': no version after '@'"),  # was "latest"
        (("pull", f"{env_id}@"), 1, f"'{env_id}@': no version after '@'"),
        (("pull", "sha256:12ab"), 1, "8 to 64 hex digits"),  # was "Malformed environment id"
        (("pull", env_id, "--registry", str(missing)), 1, "no store there"),
        (("search", "echo", "--registry", str(missing)), 1, "no store there"),
        (("verify", "--store", str(missing)), 1, "no store there"),  # was "0 verified", exit 0
        (("publish", str(folder), "--version", "1.0.1", "--report", "nope.json"), 1,
         "--report nope.json: cannot read it"),  # was FileNotFoundError
        (("dedup", "acme/*", "--threshold", "2"), 2, "--threshold"),  # was accepted
        (("pull", env_id, "--registry", "http://[::1"), 1, "registry URL 'http://[::1' is not "
         "valid"),  # was InvalidURL
    ]
    for args, code, text in cases:
        out = run_cli(*args, home=home, cwd=tmp_path)
        assert out.returncode == code, (args, out.returncode, out.stderr)
        assert "Traceback" not in out.stderr and text in out.stderr, (args, out.stderr)
    assert not missing.exists()  # reading from a mistyped store path does not create one


def test_registry_serve_refuses_a_busy_port_in_one_line(home: Path, tmp_path: Path) -> None:
    """Was uvicorn's `ERROR: [Errno 98] ...` and exit 3 (a port over 65535: a traceback)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run_cli("registry", "serve", "--registry", str(tmp_path / "srv"), "--port",
                      str(port), home=home, cwd=tmp_path)
    assert out.returncode == 1 and "check --port" in out.stderr, out.stderr
    out = run_cli("registry", "serve", "--port", "99999", home=home, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr


def test_profile_into_a_registry_checks_the_token_before_playing(server, home: Path,
                                                                 tmp_path: Path) -> None:
    """`corral profile --registry URL` without a token (or with one the registry refuses for the
    env's namespace) fails before playing any episode; it played every episode, then got 401."""
    from registry_helpers import CORRAL_TOKEN, OTHER_TOKEN

    base = ("profile", "corral/arithmetic-v0", "-n", "3", "--registry", server.url)
    cases = [(base, "--token: recording a profile in the registry"),
             ((*base, "--token", OTHER_TOKEN), "--token: the token is not allowed")]
    for args, text in cases:
        out = run_cli(*args, home=home, cwd=tmp_path)
        assert out.returncode == 1, (args, out.stderr)
        assert text in out.stderr and "nothing was played" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    ok = run_cli(*base, "--token", CORRAL_TOKEN, home=home, cwd=tmp_path)
    assert ok.returncode == 0 and "over 3 tasks" in ok.stdout, ok.stderr
    assert len(server.store.profile("corral/arithmetic-v0", "random").tasks) == 3
