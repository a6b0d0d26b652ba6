"""The sandbox contract on both real backends: exec, shell, files, kill guarantee, output cap."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from corral.sandbox.base import TRUNCATION_MARKER
from corral.sandbox.spec import Terminal


async def test_exec_exit_code_and_streams(sandbox):
    r = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
    r = await sandbox.exec(["cat", "/etc/debian_version"])
    assert r.ok and r.stdout.startswith("12")


async def test_exec_env_and_cwd(sandbox):
    r = await sandbox.exec("pwd; echo $GREETING", env={"GREETING": "hello"}, cwd="/tmp")
    assert r.stdout == "/tmp\nhello\n"


async def test_output_is_capped_without_buffering(sandbox):
    # ~200 MB through the pipe; only the limit is kept, the rest is counted and dropped
    r = await sandbox.exec("head -c 200000000 /dev/zero | tr '\\0' x; echo; echo done >&2",
                           timeout=120)
    assert r.ok and r.truncated
    assert r.stdout.startswith("x" * 1000)
    assert len(r.stdout) < (1 << 20) + 200
    assert TRUNCATION_MARKER.format(dropped=200000001 - (1 << 20)) in r.stdout
    assert r.stderr == "done\n"


async def test_exec_timeout_kills_group_and_sandbox_stays_usable(sandbox):
    t0 = time.monotonic()
    r = await sandbox.exec("sleep 1000 & sleep 1000; echo never", timeout=1)
    assert r.timed_out and not r.ok and "never" not in r.stdout
    assert time.monotonic() - t0 < 2.0
    ps = await sandbox.exec("ps -eo args | grep -c '^sleep 1000$' || true")
    assert ps.stdout.strip() == "0"  # both sleeps of the command's group are gone
    assert (await sandbox.exec("echo next")).stdout == "next\n"


async def test_shell_shares_cwd_and_env_each_command_own_exit_code(sandbox):
    sh = await sandbox.shell()
    assert (await sh.run("cd /tmp && export COLOR=green && FOO=bar")).exit_code == 0
    r = await sh.run("pwd; echo $COLOR $FOO")
    assert r.stdout == "/tmp\ngreen bar\n"
    assert (await sh.run("false")).exit_code == 1
    assert (await sh.run("(exit 7)")).exit_code == 7
    assert (await sh.run("echo 'unterminated")).exit_code == 2  # syntax error, session intact
    r = await sh.run("printf 'no newline'; printf 'e' >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("no newline", "e", 0)
    assert await sandbox.shell() is sh


async def test_shell_timeout_kills_command_not_shell(sandbox):
    sh = await sandbox.shell()
    await sh.run("cd /opt && export KEEP=1")
    await sh.run("sleep 300 >/dev/null 2>&1 &")  # an earlier background job survives
    t0 = time.monotonic()
    r = await sh.run("sleep 1000", timeout=1)
    assert r.timed_out and time.monotonic() - t0 < 2.0
    r = await sh.run("echo $PWD $KEEP; ps -eo args | grep -c '^sleep 300$'")
    assert r.stdout == "/opt 1\n1\n"


async def test_shell_stuck_in_builtin_loop_is_replaced(sandbox):
    sh = await sandbox.shell()
    t0 = time.monotonic()
    r = await sh.run("while :; do :; done", timeout=0.5)
    assert r.timed_out and time.monotonic() - t0 < 2.0
    assert (await sh.run("echo back")).stdout == "back\n"


async def test_shell_exit_reports_its_code_and_restarts_session(sandbox):
    sh = await sandbox.shell()
    assert (await sh.run("export KEPT=1; echo $$")).ok
    r = await sh.run("echo bye; exit 4")
    assert (r.exit_code, r.stdout) == (4, "bye\n")
    # a subshell's exit is not the shell's
    assert (await sh.run("(exit 5); echo $?")).stdout == "5\n"
    r = await sh.run("echo again; echo ${KEPT:-fresh}")
    assert r.stdout == "again\nfresh\n"  # the next command runs in a fresh shell


async def test_files_roundtrip(sandbox, tmp_path):
    await sandbox.write_file("/srv/data/nested/a.txt", "héllo\n", mode=0o600)
    assert await sandbox.read_file("/srv/data/nested/a.txt") == "héllo\n".encode()
    r = await sandbox.exec("stat -c %a /srv/data/nested/a.txt; cat /srv/data/nested/a.txt")
    assert r.stdout == "600\nhéllo\n"
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("/srv/missing.txt")
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "b.bin").write_bytes(bytes(range(256)))
    await sandbox.upload(tmp_path / "tree", "/work")
    await sandbox.download("/work/sub/b.bin", tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == bytes(range(256))


async def test_write_file_refuses_what_is_not_a_regular_file(sandbox):
    """A FIFO or a folder where a file is to be written: OSError at once, the folder intact.
    (Docker's fallback through the control shell blocked on the FIFO for good, jamming the
    sandbox, and the archive API replaced the folder, contents and all.)"""
    await sandbox.exec("mkdir -p /w/d && echo keep > /w/d/inner && mkfifo /w/fifo")
    for path in ("/w/fifo", "/w/d"):
        with pytest.raises(OSError):
            await asyncio.wait_for(sandbox.write_file(path, "x"), 15)
    r = await sandbox.exec("cat /w/d/inner; echo ok", timeout=10)
    assert r.stdout == "keep\nok\n"


async def test_a_tree_upload_keeps_the_hosts_files_out(sandbox, tmp_path):
    """A link to a file of the tree is copied as that file; one out of the tree (a task
    folder's `evil -> /etc/shadow`) is refused before anything is copied."""
    tree = tmp_path / "task"
    tree.mkdir()
    (tree / "run.sh").write_text("echo run\n")
    (tree / "alias.sh").symlink_to("run.sh")
    await sandbox.upload(tree, "/work/task")
    assert await sandbox.read_file("/work/task/alias.sh") == b"echo run\n"
    secret = tmp_path / "secret"
    secret.write_text("host only\n")
    (tree / "evil").symlink_to(secret)
    with pytest.raises(PermissionError, match="a link out of the uploaded folder"):
        await sandbox.upload(tree, "/work/again")
    assert (await sandbox.exec("ls /work/again")).exit_code != 0


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_a_closed_sandbox_says_so(make_sandbox, tmp_path, backend):
    """File calls on a closed sandbox raise SandboxDied (Docker's said FileNotFoundError)."""
    from corral.errors import SandboxDied

    sb = await make_sandbox(backend)
    await sb.write_file("/work/f", "x")
    await sb.close()
    for call in (sb.read_file("/etc/hostname"), sb.write_file("/work/g", "y"),
                 sb.download("/work/f", tmp_path / "f"), sb.upload(__file__, "/work/h")):
        with pytest.raises(SandboxDied):
            await call


async def test_docker_files_without_the_host_root_refuse_the_same(make_sandbox):
    """A Docker daemon whose containers' roots this host cannot open (a remote one) writes
    through the control shell or the archive API: the same refusals, nothing replaced."""
    sb = await make_sandbox("docker")
    sb._root = None  # what a remote daemon's sandbox has: the daemon path, real otherwise
    await sb.exec("mkdir -p /w/d && echo keep > /w/d/inner && mkfifo /w/fifo")
    for path, size in (("/w/fifo", 1), ("/w/d", 1), ("/w/d", 300 * 1024)):  # inline, archive
        with pytest.raises(OSError, match="not a regular file"):
            await asyncio.wait_for(sb.write_file(path, "x" * size), 15)
    await sb.write_file("/w/big", "y" * 300 * 1024)
    assert len(await sb.read_file("/w/big")) == 300 * 1024
    assert (await sb.exec("cat /w/d/inner", timeout=10)).stdout == "keep\n"


async def test_a_started_process_talks_exits_and_closes(sandbox):
    """`start_process`: stdin to stdout, stderr kept apart, b"" once it exited; after close()
    its whole tree is gone and a read returns b"" (a read waiting then hung for good)."""
    proc = await sandbox.start_process(["sh", "-c", "echo ready >&2; exec cat"])
    await proc.write(b"ping\n")
    assert await asyncio.wait_for(proc.read(), 10) == b"ping\n"
    assert "ready" in proc.stderr_tail
    waiting = asyncio.ensure_future(proc.read())
    await asyncio.sleep(0.1)
    await proc.close()
    assert await asyncio.wait_for(waiting, 5) == b""
    assert await asyncio.wait_for(proc.read(), 5) == b""
    done = await sandbox.start_process(["sh", "-c", "echo out; sleep 300 & exit 4"])
    assert await asyncio.wait_for(done.read(), 10) == b"out\n"
    await done.close()
    r = await sandbox.exec("ps -eo args | grep -cx -e cat -e 'sleep 300'", timeout=10)
    assert r.stdout.strip() == "0", r


async def test_a_process_that_cannot_start_says_why_on_stderr(sandbox):
    proc = await sandbox.start_process(["/no/such-server", "--stdio"])
    assert await asyncio.wait_for(proc.read(), 10) == b""  # nothing on stdout: it never ran
    assert "/no/such-server" in proc.stderr_tail
    await proc.close()


async def test_written_bytes_and_modes_are_exact(sandbox):
    tricky = bytes(range(1, 256)) + b"'\\$(x)`y`\n%s%%\\x41"  # every byte but NUL, quoting traps
    await sandbox.write_file("/work/tricky.bin", tricky)
    assert await sandbox.read_file("/work/tricky.bin") == tricky
    await sandbox.write_file("/work/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert (await sandbox.exec("/work/run.sh")).stdout == "ran\n"
    await sandbox.write_file("/work/run.sh", "replaced\n")  # an existing file gets the new mode
    await sandbox.write_file("/work/empty", b"")
    r = await sandbox.exec("stat -c '%a %s' /work/tricky.bin /work/run.sh /work/empty")
    assert r.stdout == f"644 {len(tricky)}\n644 9\n644 0\n"


async def test_setup_files_persist_across_exec_calls(sandbox):
    await sandbox.exec("mkdir -p /etc/app && echo 1 > /etc/app/conf && echo x > /root/y")
    assert (await sandbox.exec("cat /etc/app/conf /root/y")).stdout == "1\nx\n"


async def test_background_service_from_exec_outlives_the_call(sandbox):
    r = await sandbox.exec("nohup sleep 600 >/dev/null 2>&1 & echo started")
    assert r.stdout == "started\n"
    assert (await sandbox.exec("ps -eo args | grep -c '^sleep 600$'")).stdout == "1\n"


async def test_closed_defaults(sandbox):
    r = await sandbox.exec("grep -E '^Cap(Bnd|Eff)' /proc/self/status; "
                           "grep NoNewPrivs /proc/self/status")
    assert "NoNewPrivs:\t1" in r.stdout
    bounding = int(r.stdout.split("CapBnd:")[1].split()[0], 16)
    assert bounding & (1 << 21) == 0  # CAP_SYS_ADMIN is not in the bounding set
    r = await sandbox.exec("mount -t tmpfs none /mnt")
    assert r.exit_code != 0


@pytest.mark.parametrize("field, value, message", [
    ("memory", "0", "below the minimum of 6m"),  # docker reads 0 as no limit at all
    ("memory", "5m", "below the minimum of 6m"),
    ("cpus", float("inf"), "finite number"),
    ("cpus", float("nan"), "finite number"),
    ("disk", "xyz", "not a size"),
    ("workdir", "rel/dir", "not an absolute path"),
    ("user", "", "at least 1 character"),
    ("image", "", "is not an image tag"),  # Docker said "Resource ID was not provided"
    ("image", "corral/base: bookworm", "is not an image tag"),
])
def test_specs_that_would_open_or_break_a_sandbox_are_refused(field: str, value: object,
                                                              message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Terminal(**{field: value})
    assert Terminal(memory="6m", disk="10g", workdir="/srv", user="agent").memory == "6m"


def docker_execs(container_id: str, since: int) -> int:
    """Docker execs created in the container since `since` (the daemon's events)."""
    import docker

    until = int(time.time()) + 1
    return sum(1 for _ in docker.from_env().events(since=since, until=until, decode=True, filters={
        "container": container_id, "event": "exec_create"}))


async def test_docker_root_commands_reuse_the_control_shell(make_sandbox):
    """A prepared sandbox's shells are running before first use, started by the container
    itself (no Docker exec at all); root one-shot commands run in the sandbox's idle control
    shell; concurrent ones overflow to Docker execs; another user's command gets its own."""
    sb = await make_sandbox("docker")
    await sb.prepare()  # starts the agent's shell and the control shell, as the pool does
    since = int(time.time()) - 5  # before the sandbox made any exec (it is this test's own)

    def exec_count() -> int:
        return docker_execs(sb.id, since)

    before = exec_count()
    assert before == 0
    await sb.write_file("/work/f.txt", "x")
    assert (await (await sb.shell()).run("cat /work/f.txt")).stdout == "x"
    for i in range(5):
        r = await sb.exec(["sh", "-c", 'echo "$0 $X $(pwd) $(id -u)"; exit 4', str(i)],
                          env={"X": "y"}, cwd="/work")
        assert (r.exit_code, r.stdout) == (4, f"{i} y /work 0\n")
    assert exec_count() == before
    assert (await sb.exec(["exit", "0"])).exit_code == 127  # a builtin is not a program
    results = await asyncio.gather(*(sb.exec(f"sleep 0.3; echo {i}") for i in range(3)))
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    assert exec_count() == before + 2  # the two that found the control shell busy
    r = await sb.exec("id -un", user="nobody")
    assert r.stdout == "nobody\n"


async def test_docker_terminate_kills_everything_without_the_daemon(make_sandbox):
    """`terminate` empties the container (host side, through its cgroup); `close` removes it."""
    import docker

    sb = await make_sandbox("docker")
    await sb.exec("nohup sleep 600 >/dev/null 2>&1 &")
    await sb.terminate()
    client = docker.from_env()
    deadline = time.monotonic() + 10
    while client.api.inspect_container(sb.id)["State"]["Running"]:
        assert time.monotonic() < deadline, "the container still runs after terminate()"
        await asyncio.sleep(0.05)
    await sb.close()
    assert not client.containers.list(all=True, filters={"id": sb.id})


async def test_docker_shells_through_fifos_and_their_fallback(make_sandbox, tmp_path):
    """The container's own shells talk through root-only FIFOs: a non-root agent's shell is a
    Docker exec as that user and cannot reach them; a shell that exits is replaced by an exec;
    the FIFO dir goes with the sandbox."""
    from corral.sandbox import _fifo

    since = int(time.time()) - 5

    def execs(sb) -> int:
        return docker_execs(sb.id, since)

    sb = await make_sandbox("docker", user="nobody", workdir="/tmp")
    await sb.prepare()
    assert execs(sb) == 1  # the agent's shell; the control shell is the container's
    shell = await sb.shell()
    r = await shell.run(f"id -un; ls {_fifo.MOUNT} 2>&1; echo x > {_fifo.MOUNT}/control.in")
    assert r.stdout.startswith("nobody\n") and "Permission denied" in r.stdout + r.stderr
    assert r.exit_code != 0
    assert (await sb.exec("id -un", user="root")).stdout == "root\n"
    assert execs(sb) == 1  # through the control shell

    root = await make_sandbox("docker")
    io_dir = root._io_dir
    assert io_dir is not None and io_dir.is_dir()
    assert not _fifo.usable(root.id, tmp_path, "control")  # not the container's mount
    data = bytes(range(1, 256)) * 800  # 200 KB
    await root.write_file("/tmp/big", data)  # from the host, through the container's root
    assert await root.read_file("/tmp/big") == data
    held, root._root = root._root, None
    assert held is not None  # reachable here: the write above went through it
    # where it is not (user namespaces, another machine's daemon): the control shell's stdin
    # (a 64 KiB pipe) and the daemon's archive API
    await root.write_file("/tmp/big2", data)
    assert await root.read_file("/tmp/big2") == data
    root._root = held
    shell = await root.shell()
    r = await shell.run("head -c 500000 /dev/zero | tr '\\0' x; echo; echo done >&2")
    assert r.stdout == "x" * 500000 + "\n" and r.stderr == "done\n"
    assert (await shell.run("cd /tmp && echo $$ > pid")).ok
    assert execs(root) == 0

    def fifo_fds() -> int:  # this process's descriptors on the sandbox's pipes
        paths = [_readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
        return sum(1 for path in paths if os.path.dirname(path) == str(io_dir))

    assert fifo_fds() == 6  # two running shells: stdin, stdout, stderr each
    await shell.run("exit 3")
    r = await shell.run("pwd; cat /tmp/pid")
    assert r.ok and r.stdout.startswith("/root\n")  # a fresh shell, back in the workdir
    assert execs(root) == 1  # the replacement is a Docker exec
    await root.close()
    assert not io_dir.exists() and fifo_fds() == 0


async def test_docker_verifier_shell_after_the_kill_needs_no_exec(make_sandbox):
    """After `kill_agent_processes` the next root command runs in a shell the container's main
    process starts on new FIFOs (no Docker exec), even where the agent stopped that process;
    where the main process cannot be asked, a Docker exec stands in."""
    from corral.sandbox import _fifo
    from corral.verify import clean_exec

    since = int(time.time()) - 5
    for ask in (True, False):
        sb = await make_sandbox("docker")
        await sb.prepare()
        r = await (await sb.shell()).run("kill -STOP $(pgrep -o -P 1); sleep 600 &")
        assert r.ok, r
        if not ask:  # the main process's request pipe is gone
            (sb._io_dir / _fifo.START).unlink()
        await sb.kill_agent_processes()
        r = await clean_exec(sb, "id -un; pgrep -x sleep || echo none; "
                             "[ -e /proc/self/fd/3 ] && echo start-fifo-inherited")  # no timeout
        assert r.stdout == "root\nnone\n", r
        assert docker_execs(sb.id, since) == (0 if ask else 1), ask


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed meanwhile
        return ""


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_kill_without_a_baseline_keeps_the_sandbox_up(make_sandbox, backend: str) -> None:
    """With nothing to spare, the agent's processes die and the sandbox stays usable: its
    init and main process survive (in a container the main process is not pid 2 inside:
    tini's start takes a few), from the host and, in a container, from inside alike (the way
    used where the daemon is remote)."""
    from corral.sandbox._dockerkill import INSIDE_KILL

    sb = await make_sandbox(backend)
    for kill in ("host", "inside") if backend == "docker" else ("host",):
        await sb.exec("nohup sleep 1000 >/dev/null 2>&1 & disown")
        assert "sleep 1000" in (await sb.exec("pgrep -xa sleep")).stdout
        if kill == "host":
            await sb.kill_agent_processes()
        else:
            await sb.exec(["sh", "-c", INSIDE_KILL], timeout=30, user="0")
        result = await sb.exec("pgrep -xa sleep; echo up")
        assert result.exit_code == 0 and "sleep 1000" not in result.stdout, (kill, result)
        assert "up" in result.stdout and sb.alive


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_process_keys_are_setups_processes_not_the_sandboxs_own(make_sandbox,
                                                                     backend: str) -> None:
    """`process_keys` lists what setup may have left running, never the sandbox's own
    processes: with its shells started (as a pooled sandbox's are, before setup) it is empty;
    a detached service and a job of the persistent shell are listed; the shell itself is not,
    and the kill spares what the list names."""
    sb = await make_sandbox(backend)
    await sb.prepare()
    assert (await (await sb.shell()).run("true")).ok
    assert await sb.process_keys() == frozenset()
    # each returns once its background fork has become sleep
    became = 'until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done'
    await sb.exec(f"nohup sleep 1001 >/dev/null 2>&1 & {became}; disown", timeout=10)
    assert (await (await sb.shell()).run(f"sleep 1002 >/dev/null 2>&1 & {became}",
                                         timeout=10)).ok
    keys = await sb.process_keys()
    assert keys is not None
    by_command = {Path(f"/proc/{pid}/cmdline").read_bytes(): (pid, start) for pid, start in keys}
    assert sorted(by_command) == [b"sleep\x001001\x00", b"sleep\x001002\x00"]
    await sb.kill_agent_processes(frozenset({by_command[b"sleep\x001001\x00"]}))
    left = (await sb.exec("pgrep -xa sleep")).stdout
    assert "sleep 1001" in left and "sleep 1002" not in left and sb.alive
