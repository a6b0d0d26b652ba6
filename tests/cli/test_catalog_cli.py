"""The `corral` CLI as users run it: a real subprocess, real exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

CORRAL = [sys.executable, "-m", "corral.cli"]


def corral(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*CORRAL, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


ECHO_ENV = textwrap.dedent('''
    import corral as cr

    @cr.environment("mine/echo-v0", tasks=[{"word": "hi"}, {"word": "yo"}], tags=["demo"])
    def echo(task):
        """Repeat a word."""
        return f"Say {task.word}"

    @echo.reward
    def same(task, completion):
        return completion == task.word

    @echo.solution
    def solve(task):
        return task.word
''')


def test_list_shows_builtins_with_kind_tasks_tags() -> None:
    out = corral("list", "corral/*")
    assert out.returncode == 0, out.stderr
    line = next(row for row in out.stdout.splitlines() if "corral/countdown-v0" in row)
    assert "text" in line and "100,000" in line and "search" in line


def test_user_env_file_registers_lists_and_runs(tmp_path: Path) -> None:
    (tmp_path / "myenv.py").write_text(ECHO_ENV)
    listed = corral("-i", "myenv.py", "list", "mine/*", cwd=tmp_path)
    assert listed.returncode == 0 and "mine/echo-v0" in listed.stdout
    ran = corral("-i", "myenv.py", "run", "mine/echo", "--agent", "oracle", "-n", "3", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "mean reward 1.000 over 3 episodes" in ran.stdout
    info = corral("-i", "myenv.py", "info", "mine/echo-v0", "--json", cwd=tmp_path)
    assert '"tasks": 2' in info.stdout and '"same": 1.0' in info.stdout


def test_info_shows_tool_schemas() -> None:
    out = corral("info", "corral/guess-number-v0")
    assert out.returncode == 0 and "Find a secret number" in out.stdout
    assert "multi-turn" in out.stdout


def test_errors_are_one_line_and_nonzero() -> None:
    cases = {
        ("info", "corral/countdwn-v0"): "Did you mean 'corral/countdown-v0'",
        ("info", "BAD"): "Malformed environment id 'BAD'",
        ("run", "corral/arithmetic-v0", "--agent", "genius"): "unknown agent 'genius'",
        ("-i", "no_such_module_xyz", "list"): "module not found",
        ("frobnicate",): "No such command 'frobnicate'",
    }
    for args, message in cases.items():
        out = corral(*args)
        assert out.returncode != 0, args
        assert message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "Traceback" not in out.stderr


def test_validate_exit_code_gates_ci(tmp_path: Path) -> None:
    """A failed validation exits 1 (the docs promise it; CI gates on it); a passing one 0."""
    (tmp_path / "gate.py").write_text(ECHO_ENV + textwrap.dedent('''
        @cr.environment("gate/broken-v0", tasks=[{"word": "hi"}])
        def broken(task):
            return f"Say {task.word}"

        @broken.reward
        def never(task, completion):
            return 0.0

        @broken.solution
        def wrong(task):
            return "nope"
    '''))
    good = corral("-i", "gate.py", "validate", "mine/echo-v0", cwd=tmp_path)
    bad = corral("-i", "gate.py", "validate", "gate/broken-v0", cwd=tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    assert bad.returncode == 1 and "FAILED" in bad.stdout, bad.stdout + bad.stderr


def test_run_exits_1_when_no_episode_could_be_played(tmp_path: Path) -> None:
    """Every episode an infrastructure error (here the image is missing): the table still shows
    each episode's note, then one `error:` line and exit 1 (it was exit 0)."""
    (tmp_path / "noimage.py").write_text(textwrap.dedent('''
        import corral as cr

        @cr.environment("mine/noimage-v0", sandbox=cr.Terminal(image="corral/no-such-image:x"),
                        tasks=[{"name": "a"}])
        class NoImage(cr.TerminalEnv):
            """Needs an image nobody built."""

            def instruction(self, task):
                return "Do nothing."

            @cr.reward
            async def done(self, sandbox, task) -> float:
                return 1.0
    '''))
    out = corral("-i", "noimage.py", "run", "mine/noimage-v0", "-n", "2", "--agent", "noop",
                 cwd=tmp_path)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert out.stdout.count("ImageNotFound") == 2, out.stdout
    assert out.stderr.strip().startswith("error:") and len(out.stderr.strip().splitlines()) == 1
    assert "no episode of mine/noimage-v0 could be played" in out.stderr, out.stderr


def test_import_file_of_an_env_folder_keeps_its_relative_imports(tmp_path: Path) -> None:
    """docs/registry.md: an env folder imports its own modules relatively. `-i folder/env.py`
    imports env.py as a module of that folder (a corral.toml or an __init__.py marks it); it
    failed with 'attempted relative import with no known parent package'."""
    for marker in ("corral.toml", "__init__.py"):
        folder = tmp_path / marker.replace(".", "_")
        folder.mkdir()
        (folder / marker).write_text('[[env]]\nid = "mine/rel-v0"\nentry_point = "env:echo"\n'
                                     if marker == "corral.toml" else "")
        (folder / "helpers.py").write_text('WORDS = [{"word": "hi"}, {"word": "yo"}]\n')
        (folder / "env.py").write_text(ECHO_ENV.replace("mine/echo-v0", "mine/rel-v0").replace(
            'tasks=[{"word": "hi"}, {"word": "yo"}]', "tasks=WORDS").replace(
            "import corral as cr", "import corral as cr\nfrom .helpers import WORDS"))
        ran = corral("-i", f"{folder.name}/env.py", "run", "mine/rel-v0", "-n", "2",
                     cwd=tmp_path)
        assert ran.returncode == 0, (marker, ran.stderr)
        assert "mean reward 1.000 over 2 episodes" in ran.stdout


def test_import_file_of_a_folder_registers_what_its_manifest_lists(tmp_path: Path) -> None:
    """The manifest names the env once: env.py's decorator has no id, `-i folder/env.py` lists
    the folder's envs with the manifest's id, tags and description, and runs them."""
    folder = tmp_path / "listed"
    folder.mkdir()
    (folder / "corral.toml").write_text(
        '[[env]]\nid = "mine/listed-v1"\nentry_point = "env:echo"\nkind = "text"\n'
        'tags = ["demo", "manifest"]\ndescription = "Repeat a word, as listed."\n')
    (folder / "env.py").write_text(ECHO_ENV.replace('"mine/echo-v0", ', "").replace(
        ', tags=["demo"]', ""))
    shown = corral("-i", "listed/env.py", "info", "mine/listed-v1", "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["tags"] == ["demo", "manifest"]
    assert info["description"] == "Repeat a word, as listed."
    ran = corral("-i", "listed/env.py", "run", "mine/listed-v1", "-n", "2", cwd=tmp_path)
    assert ran.returncode == 0 and "mean reward 1.000 over 2 episodes" in ran.stdout, ran.stderr


def test_help_paragraphs_are_reflowed() -> None:
    """A command's docstring wraps at the source's width; its help wraps at the terminal's, not
    at both (typer's rich mode kept the source's breaks: "and\\n difficulty bands")."""
    out = corral("profile", "--help")
    assert out.returncode == 0, out.stderr
    assert "dataset card shows them, and difficulty bands use them." in out.stdout
    listed = corral("--help")
    line = next(row for row in listed.stdout.splitlines() if " run " in row)
    assert line.rstrip(" │").endswith("print their rewards.")
    # an extra to install is text, not rich markup (it read "Needs corral.")
    assert "corral[mcp]" in corral("serve-env", "--help").stdout


def test_every_server_starts_as_corral_serve_kind_and_the_older_spellings_still_work() -> None:
    """One way to start a server: `corral serve env|policy|registry|engine`; `serve-env`,
    `serve-policy`, `registry serve` and `engine start` are the same commands (hidden)."""
    from typer.testing import CliRunner

    from corral.cli import app

    runner = CliRunner()
    listing = runner.invoke(app, ["serve", "--help"])
    assert listing.exit_code == 0, listing.output
    for kind in ("env", "policy", "registry", "engine"):
        assert kind in listing.output
    pairs = [(["serve", "env"], ["serve-env"]), (["serve", "policy"], ["serve-policy"]),
             (["serve", "registry"], ["registry", "serve"]),
             (["serve", "engine"], ["engine", "start"])]
    for new, old in pairs:
        a, b = runner.invoke(app, [*new, "--help"]), runner.invoke(app, [*old, "--help"])
        assert a.exit_code == b.exit_code == 0, (a.output, b.output)
        options = lambda out: sorted(w for w in out.split() if w.startswith("--"))  # noqa: E731
        assert options(a.output) == options(b.output) and options(a.output), (new, old)
    top = runner.invoke(app, ["--help"]).output
    assert "serve-env" not in top and "serve-policy" not in top
