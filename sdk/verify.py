"""The verify phase of terminal envs: what happens between the agent's last command and the
verifier's first.

An agent shares its sandbox with the verifier that judges it, so everything it left behind is
suspect. Before any reward runs:

1. every process the agent started is killed from the host (detached loops that would rewrite
   outputs or kill the verifier included); what setup left running is spared, unless the env
   says the agent's processes are the task's output (a service it had to start);
2. the verifier's own locations (`/tests`, `/logs/verifier`) are recreated empty, owned by
   root, and files no legitimate task leaves at `/` (a `conftest.py`, pytest config) removed;
3. the writable layer is read from the host for files the agent created or changed that a
   verifier would execute: interpreters and shells on PATH, `sitecustomize.py`,
   `/etc/ld.so.preload`, a `pytest` module in the verifier's working directory. Inode change
   times say when, and cannot be faked from inside. Such an episode scores 0 without running
   the verifier (it is the agent's doing, not the env's bug);
4. verifier commands run as root through `clean_exec`: `bash --noprofile --norc` with the
   sandbox's configured environment (the image's and the spec's, which the agent cannot
   change), never a login shell that would read the agent's ~/.bashrc, ~/.profile or aliases.

`verify_in="fresh"` instead verifies in a new sandbox (setup run again) that receives only the
agent's declared outputs (`transfer`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import posixpath
import re
import shlex
import time
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import OutputTooLarge, SandboxError
from .sandbox.base import ExecResult, Sandbox

__all__ = ["Baseline", "DEFAULT_PROTECTED", "INTERPRETER_PATHS", "LAUNCHERS", "LOADER_PATHS",
           "RESET", "RESET_TOOLS", "ROOT_PLANTS", "SYSTEM_PATH", "TESTS_DIR", "VERIFIER_ENV",
           "VERIFIER_LOGS", "VERIFIER_TOOLS", "clean_exec", "isolate", "note_setup", "protected",
           "reset_locations", "transfer", "within"]

log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # backends already warned about (once per process)

TESTS_DIR = "/tests"
VERIFIER_LOGS = "/logs/verifier"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what the verifier's shell is started with on top of the sandbox's configured environment:
# no startup files for a non-interactive bash (BASH_ENV) or sh (ENV), no user site-packages
VERIFIER_ENV = {"BASH_ENV": "", "ENV": "", "PYTHONNOUSERSITE": "1", "HOME": "/root"}
# files at the root of the filesystem that no task needs and that pytest would pick up for
# tests under /tests (its rootdir walks up to /)
ROOT_PLANTS = ("/conftest.py", "/pytest.ini", "/tox.ini", "/setup.cfg", "/pyproject.toml")
# programs of the image that every command a sandbox runs (the verifier's too) passes through
# before its own: the one-shot wrapper's `setsid`, and on bubblewrap the `setpriv` that drops
# privileges and the `prlimit` that sets limits where there is no cgroup
LAUNCHERS = ("setsid", "setpriv", "prlimit")
# what the verify phase's reset runs as root inside the sandbox where it cannot work from the
# host (`reset_locations`), after the agent's processes are gone: a replaced one would start a
# process of the agent's that outlives the kill
RESET_TOOLS = ("rm", "mkdir", "chown", "chmod")
# programs a verifier runs: replaced or shadowed during the episode means tampering
VERIFIER_TOOLS = ("bash", "sh", "dash", "env", "python", "python3", "python3.*", "pytest",
                  "py.test", "uv", "uvx", "pip", "pip3", "cat", "grep", "diff", "cmp", "test",
                  "[", "timeout", "tee", "true", "false", "echo", "printf", "sort", "wc", "find",
                  *LAUNCHERS, *RESET_TOOLS)
# what every interpreter runs before the verifier's own code: Python's start-up hooks (`site`
# executes any .pth file; sitecustomize/usercustomize, also as bytecode), Debian's standard
# library (bytecode caches included: a planted .pyc carrying the source's mtime is loaded), a
# pyvenv.cfg beside or above the interpreter (it relocates site-packages)
INTERPRETER_PATHS = ("*.pth", "*/sitecustomize.*", "*/usercustomize.*", "/usr/lib/python3.*",
                     "/usr/pyvenv.cfg", "/usr/local/pyvenv.cfg",
                     *(f"{folder}/pyvenv.cfg" for folder in SYSTEM_PATH.split(":")))
# what the dynamic loader reads for every program: its preload list, configuration and cache
# (ldconfig), itself, and shared libraries directly in the folders it searches (packages'
# extension modules deeper down are not on its path)
LOADER_PATHS = ("/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d*",
                "/etc/ld.so.cache", r"re:(/usr(/local)?)?/lib(32|64)?(/[a-z0-9_]+-linux-gnu"
                                    r"[a-z]*)?/[^/]+\.so(\.[^/]*)?")
DEFAULT_PROTECTED: tuple[str, ...] = (
    *(f"{folder}/{tool}" for folder in SYSTEM_PATH.split(":") for tool in VERIFIER_TOOLS),
    *INTERPRETER_PATHS, *LOADER_PATHS,
    "{workdir}/pytest.py", "{workdir}/pytest", "{workdir}/_pytest", "{workdir}/conftest.py")
"""Globs (`{workdir}` = the verifier's working directory; `*` also matches `/`; a pattern
starting `re:` is a regular expression matching the whole path) of files that, created, changed
or deleted by the agent, let it decide what the verifier sees. Envs whose agents must
legitimately change one of them (`pip install` of a package shipping a `.pth`) set
`protected_paths`, or verify `"fresh"`."""


async def clean_exec(sandbox: Sandbox, script: str, *, timeout: float | None = None,
                     cwd: str | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
    """Run `script` as root under `bash --noprofile --norc -c` with the sandbox's configured
    environment plus `VERIFIER_ENV` and `env`: nothing the agent wrote into startup files,
    aliases or its shell's variables applies. `timeout` (seconds) as `Sandbox.exec`'s; the
    verify phase's own deadline bounds it either way."""
    return await sandbox.exec(["bash", "--noprofile", "--norc", "-c", script], timeout=timeout,
                              cwd=cwd, env={**VERIFIER_ENV, **(env or {})}, user="root")


_DIRS = f"{TESTS_DIR} {VERIFIER_LOGS}"
RESET = (f"for d in {posixpath.dirname(VERIFIER_LOGS)} {_DIRS}; do "
         "[ -L \"$d\" ] && rm -f \"$d\"; done; "  # a link the agent made would move them
         f"rm -rf {_DIRS} $PLANTS; mkdir -p {_DIRS} && "
         f"chown root:root {_DIRS} && chmod 755 {_DIRS}")


async def reset_locations(sandbox: Sandbox) -> None:
    """Recreate `/tests` and `/logs/verifier` empty and root's (a link the agent put in their
    place is removed, not followed) and drop root-level pytest plants: from the host where the
    backend can (`Sandbox.recreate_dirs`: nothing of the image runs), else inside."""
    try:
        if await sandbox.recreate_dirs((TESTS_DIR, VERIFIER_LOGS), remove=ROOT_PLANTS):
            return
    except OSError as exc:
        raise SandboxError(f"resetting the verifier's locations failed: {exc}") from exc
    # the plants' names travel in the environment: a command line naming pytest is what an
    # agent's verifier-killing loop looks for
    result = await clean_exec(sandbox, RESET, timeout=60, env={"PLANTS": " ".join(ROOT_PLANTS)})
    if not result.ok:
        raise SandboxError(f"resetting the verifier's locations failed: {result.output[-300:]}")


@dataclass(frozen=True)
class Baseline:
    """What the sandbox was like when setup ended: the time, and the processes running."""

    since: float
    processes: frozenset[tuple[int, int]]


async def note_setup(sandbox: Sandbox) -> Baseline:
    """The baseline the verify phase compares against (taken once setup is done)."""
    return Baseline(time.time(), await sandbox.process_keys() or frozenset())


def protected(path: str, patterns: tuple[str, ...], workdir: str) -> bool:
    """Whether `path` matches one of `patterns` (`{workdir}` substituted; see
    `DEFAULT_PROTECTED`)."""
    workdir = workdir.rstrip("/") or ""
    for pattern in patterns:
        pattern = pattern.replace("{workdir}", workdir)
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], path):
                return True
        elif fnmatch.fnmatchcase(path, pattern):
            return True
    return False


async def isolate(sandbox: Sandbox, baseline: Baseline, *, kill: bool, workdir: str,
                  patterns: tuple[str, ...]) -> list[str]:
    """Steps 1–3 of the module docstring; returns the protected paths the agent tampered with
    (empty when none, or when the writable layer is not visible from here)."""
    if kill:
        try:
            killed = await sandbox.kill_agent_processes(baseline.processes)
            log.debug("verify phase: killed %d agent process(es)", killed)
        except SandboxError as exc:  # a backend without process control (a new row)
            if sandbox.backend not in _WARNED:
                _WARNED.add(sandbox.backend)
                log.warning("verify phase: agent processes are not killed (%s)", exc)
    changed = await sandbox.changed_since(baseline.since)
    await reset_locations(sandbox)
    if changed is None:
        log.debug("verify phase: %s cannot list changed files; no tamper check",
                  sandbox.backend)
        return []
    return [p for p in changed if protected(p, patterns, workdir)]


def within(path: str, outputs: list[str]) -> bool:
    """Whether `path` is one of `outputs` or inside one of them (folders)."""
    return any(path == out.rstrip("/") or path.startswith(out.rstrip("/") + "/")
               for out in outputs)


async def transfer(source: Sandbox, target: Sandbox, paths: list[str]) -> list[str]:
    """Copy the agent's declared outputs (files or folders) from `source` into `target`;
    returns those that did not exist, or were over the source's `read_limit` (not copied).

    Files are read from the host (nothing in `source` runs). A folder travels as one tar
    archive made by `source`'s own `tar` (which the agent may have replaced: it can only ever
    say what the folder holds, which the agent decides anyway) and unpacked inside that folder
    by `target`'s `tar`, which drops absolute and `..` member names and defers links, so the
    archive cannot write anywhere else."""
    missing = []
    archive = "/tmp/.corral-outputs.tgz"
    for path in paths:
        quoted = shlex.quote(path)
        try:
            with contextlib.suppress(IsADirectoryError):  # a folder: packed with tar below
                await target.write_file(path, await source.read_file(path))
                continue
            await _checked(source, f"tar -C {quoted} -czf {archive} .")
            await target.write_file(archive, await source.read_file(archive))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            missing.append(path)
            continue
        except OutputTooLarge as exc:  # the agent's to answer for: its verifier finds nothing
            log.info("output %s is not copied to the fresh sandbox: %s", path, exc)
            missing.append(path)
            continue
        await _checked(target, f"mkdir -p {quoted} && tar -C {quoted} -xzf {archive} && "
                               f"rm -f {archive}")
    return missing


async def _checked(sandbox: Sandbox, script: str) -> Any:
    result = await clean_exec(sandbox, script, timeout=120)
    if not result.ok:
        raise SandboxError(f"copying outputs failed: {result.output[-300:]}")
    return result
