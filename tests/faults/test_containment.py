"""One containment suite for every terminal backend: each case is a real hostile action taken
from inside a sandbox (or through the host-side file API an agent's tools reach), and the host
must come out untouched (issue 14, items 1 and 2).

Nothing here may harm the host when containment fails: sysctls are written with the value they
already hold, /proc/sysrq-trigger and kernel/core_pattern are only opened (never written), and
the files an escape would touch live in pytest's tmp_path.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from corral.errors import SandboxError
from corral.sandbox import open_sandbox, restore_sandbox
from corral.sandbox.containers import CAP_ADD
from corral.sandbox.spec import Terminal
from corral.verify import reset_locations

BACKENDS = ["docker", "bwrap"]
# what a refused host-side file operation may raise: the OS's own error, or the backend's
REFUSED = (OSError, SandboxError)
CAP_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6,
            "SETUID": 7, "NET_BIND_SERVICE": 10}
HARMLESS_CAPS = sum(1 << CAP_BITS[name] for name in CAP_ADD)


@pytest.fixture(scope="module")
async def snapshots(base_image: str, run_id: str):
    """A snapshot per backend of a sandbox that ran a command (then closed): the forked
    sandboxes of the suite start from them, as `Sandbox.fork` starts its children."""
    made = {}
    try:
        for backend in BACKENDS:
            parent = await open_sandbox(Terminal(image=base_image), backend, run_id=run_id,
                                        env_id="tests/faults")
            try:
                await parent.exec("echo parent > /tmp/parent")
                made[backend] = await parent.snapshot()
            finally:
                await parent.close()
        yield made
    finally:
        for snap in made.values():
            await snap.discard()


@pytest.fixture(params=[*BACKENDS, *(f"{b}-fork" for b in BACKENDS)])
async def sb(request: pytest.FixtureRequest, base_image: str, run_id: str, snapshots):
    """A sandbox with the default (closed) spec, its agent running as root: the strongest
    position an agent gets. Fresh, or (`-fork`) forked from a sandbox that ran before: a fork
    must contain the agent exactly as a fresh sandbox does (issue 32)."""
    backend, _, forked = request.param.partition("-")
    if forked:
        sandbox = await restore_sandbox(snapshots[backend], run_id=run_id)
        assert (await sandbox.read_file("/tmp/parent")) == b"parent\n"
    else:
        sandbox = await open_sandbox(Terminal(image=base_image), backend, run_id=run_id,
                                     env_id="tests/faults")
    try:
        yield sandbox
    finally:
        await sandbox.close()


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host directory holding a secret file; nothing may appear in it or read it."""
    (tmp_path / "secret").write_text("host-canary\n")
    return tmp_path


def untouched(canary: Path) -> bool:
    return sorted(p.name for p in canary.iterdir()) == ["secret"] and \
        (canary / "secret").read_text() == "host-canary\n"


async def sh(sandbox, command: str) -> str:
    """Run `command` in the sandbox as root and return stdout (the exit code is in the output
    where a case needs it)."""
    return (await sandbox.exec(command, timeout=30)).stdout


async def test_write_through_symlink_to_host_dir_stays_inside(sb, canary: Path) -> None:
    await sh(sb, f"ln -s {canary} /tmp/evil && ln -s / /tmp/rootlink")
    for path in ("/tmp/evil/pwned", f"/tmp/rootlink{canary}/pwned2"):
        try:
            await sb.write_file(path, "written by the agent\n")
        except REFUSED:
            pass
    assert untouched(canary)


async def test_read_through_symlink_to_host_file_is_refused(sb, canary: Path) -> None:
    await sh(sb, f"ln -s {canary}/secret /tmp/leak")
    with pytest.raises(REFUSED):
        data = await sb.read_file("/tmp/leak")
        assert b"host-canary" not in data  # a file of that name inside the sandbox is fine


async def test_magic_proc_links_do_not_lead_to_the_host(sb, canary: Path) -> None:
    # /proc/self/root resolves against whoever opens it: the host, for a host-side write
    await sh(sb, f"ln -s /proc/self/root{canary} /tmp/magic; "
                 f"ln -s /proc/self/root{canary}/secret /tmp/magicfile")
    try:
        await sb.write_file("/tmp/magic/pwned", "x")
    except REFUSED:
        pass
    try:
        assert b"host-canary" not in await sb.read_file("/tmp/magicfile")
    except REFUSED:
        pass
    assert untouched(canary)


async def test_dotdot_traversal_stays_inside(sb, canary: Path) -> None:
    try:
        await sb.write_file(f"/../../../..{canary}/pwned", "x")
    except REFUSED:
        pass
    with pytest.raises(REFUSED):
        await sb.read_file(f"../../../../..{canary}/secret")
    assert untouched(canary)


async def test_the_verify_reset_follows_no_link_and_runs_nothing_inside(sb, canary: Path) -> None:
    """The verify phase recreates its folders from the host: links the agent put at, above or
    inside them (to host folders, through /proc/self/root) are removed, not followed, and the
    image's programs (here an agent's `rm`, `mkdir`, `chown`, `chmod`) never run."""
    ran = "/var/tmp/ran"
    await sh(sb, f"rm -rf /logs /tests && ln -s {canary} /logs && mkdir /tests && "
                 f"ln -s {canary} /tests/host && ln -s /proc/self/root{canary} /conftest.py && "
                 f"for p in rm mkdir chown chmod; do printf '#!/bin/sh\\ntouch {ran}\\n' > "
                 "/tmp/$p && chmod 755 /tmp/$p; done; for p in rm mkdir chown chmod; do "
                 "mv -f /tmp/$p $(readlink -f $(command -v $p)); done")
    await reset_locations(sb)
    assert untouched(canary)
    listing = await sh(sb, "stat -c '%n %F %U %a' /logs/verifier /tests; ls -A /tests "
                           f"/logs/verifier; ls /conftest.py {ran} 2>&1 | wc -l")
    assert listing.splitlines() == ["/logs/verifier directory root 755",
                                    "/tests directory root 755", "/logs/verifier:", "",
                                    "/tests:", "2"], listing


async def test_links_inside_the_sandbox_resolve_in_its_root(sb) -> None:
    """A link inside the sandbox resolves in the sandbox's root, as `docker cp` does."""
    await sh(sb, "mkdir -p /srv/real /srv/sub && ln -s /srv/real /srv/alias && "
                 "ln -s ../real/f /srv/sub/rel")
    await sb.write_file("/srv/alias/f", "through the link\n")
    assert await sb.read_file("/srv/sub/rel") == b"through the link\n"
    assert await sh(sb, "cat /srv/real/f") == "through the link\n"


async def test_sysctls_are_read_only(sb) -> None:
    # rewrite the value it holds: harmless if it lands, a failure of the test all the same
    out = await sh(sb, "f=/proc/sys/kernel/printk_ratelimit_burst; v=$(cat $f); "
                       "echo $v > $f && echo WROTE; "
                       "(exec 3>>/proc/sys/kernel/core_pattern) 2>/dev/null && echo OPENED; "
                       "(exec 3>>/proc/sys/vm/drop_caches) 2>/dev/null && echo OPENED2; true")
    assert "WROTE" not in out and "OPENED" not in out

    # nor through the host-side file API: a different (harmless) value, put back if it lands
    sysctl = Path("/proc/sys/kernel/printk_ratelimit_burst")
    before = sysctl.read_text()
    try:
        await sb.write_file(str(sysctl), f"{int(before) + 1}\n")
    except REFUSED:
        pass
    finally:
        after = sysctl.read_text()
        if after != before:
            sysctl.write_text(before)
    assert after == before, "the host's sysctl was written from the sandbox"


async def test_sysrq_trigger_cannot_be_opened_for_writing(sb) -> None:
    # opening writes nothing; only write(2) on it acts
    out = await sh(sb, "(exec 3>>/proc/sysrq-trigger) 2>/dev/null && echo OPENED; true")
    assert "OPENED" not in out


async def test_kernel_memory_and_host_timers_are_masked(sb) -> None:
    for path in ("/proc/kcore", "/proc/keys", "/proc/timer_list"):
        out = await sh(sb, f"cat {path} 2>/dev/null | head -c 64 | wc -c")
        assert out.strip() == "0", path


async def test_mounting_and_new_namespaces_are_refused(sb) -> None:
    out = await sh(sb, "mount -t tmpfs none /mnt 2>/dev/null && echo MOUNTED; "
                       "mount --bind /proc /mnt 2>/dev/null && echo BOUND; "
                       "unshare -Ur true 2>/dev/null && echo USERNS; "
                       "unshare -m true 2>/dev/null && echo MNTNS; true")
    assert out == ""


async def test_kernel_modules_keyrings_and_bpf_are_refused(sb) -> None:
    probe = ("import ctypes, os\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "def call(nr, *args):\n"
             "    ret = libc.syscall(nr, *args)\n"
             "    return 'ok' if ret >= 0 else os.strerror(ctypes.get_errno())\n"
             # finit_module(-1): a permitted caller gets EBADF, a refused one EPERM
             "print('finit_module', call(313, -1, b'', 0))\n"
             "print('delete_module', call(176, b'corral_nope', 0))\n"
             # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): keyrings are not namespaced
             "print('keyctl', call(250, 1, None))\n"
             # bpf(BPF_PROG_LOAD, NULL, 0) and perf_event_open: host-wide kernel surfaces
             "print('bpf', call(321, 5, None, 0))\n"
             "print('userfaultfd', call(323, 0))\n"
             "print('kexec_load', call(246, 0, 0, None, 0))\n")
    out = (await sb.exec(["python3", "-c", probe], timeout=30)).stdout
    results = dict(line.split(" ", 1) for line in out.splitlines())
    assert set(results) == {"finit_module", "delete_module", "keyctl", "bpf", "userfaultfd",
                            "kexec_load"}
    assert all(r == "Operation not permitted" for r in results.values()), results


async def test_capabilities_are_only_the_harmless_ones(sb) -> None:
    out = await sh(sb, "grep -E '^(CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status")
    status = dict(line.split(":\t") for line in out.splitlines())
    for key in ("CapEff", "CapBnd"):
        assert int(status[key], 16) & ~HARMLESS_CAPS == 0, status
    assert int(status["CapAmb"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2", "no seccomp filter on the agent's commands"


def _host_pids(argv: list[str]) -> list[int]:
    """Host pids whose command line is exactly `argv`."""
    want = ("\0".join(argv) + "\0").encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes() == want:
                    found.append(int(entry))
            except OSError:
                pass
    return found


async def test_sandbox_root_is_not_host_root(sb) -> None:
    """What the host sees of the agent's root: bwrap maps it to an unprivileged host uid in a
    user namespace. Docker's default (no userns-remap) keeps host uid 0, bounded by dropped
    capabilities, no-new-privileges and seccomp: checked here so a change is noticed."""
    token = "4242.%d" % os.getpid()
    await sh(sb, f"nohup sleep {token} >/dev/null 2>&1 &")
    pids: list[int] = []
    for _ in range(200):  # the background process shows up within milliseconds
        pids = _host_pids(["sleep", token])
        if pids:
            break
        await asyncio.sleep(0.01)
    assert len(pids) == 1
    status = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pids[0]}/status").read_text().splitlines())
    host_uids = {int(u) for u in status["Uid"].split()}
    cap_eff = int(status["CapEff"].strip(), 16)
    if sb.backend == "bwrap":
        assert 0 not in host_uids, status["Uid"]
        own_userns = os.readlink("/proc/self/ns/user")
        assert os.readlink(f"/proc/{pids[0]}/ns/user") != own_userns
    else:
        assert cap_eff & ~HARMLESS_CAPS == 0


async def test_hostname_cannot_be_changed(sb) -> None:
    before = socket.gethostname()
    out = await sh(sb, "hostname corral-evil 2>/dev/null && echo CHANGED; "
                       "python3 -c \"import socket; socket.sethostname('corral-evil')\" "
                       "2>/dev/null && echo CHANGED2; hostname")
    assert "CHANGED" not in out
    assert socket.gethostname() == before


async def test_reading_a_huge_file_out_is_refused_with_bounded_memory(sb) -> None:
    """A 1 GiB sparse file costs the agent nothing: `read_file`, `download` and a fresh
    verify's transfer refuse it at the sandbox's `read_limit` instead of reading it whole
    into the host's memory (+2 GiB of RSS before)."""
    import resource

    from corral.errors import OutputTooLarge
    from corral.verify import transfer

    await sb.exec("truncate -s 1G /root/big && echo small > /root/small")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    readers = [sb]
    if sb.backend == "docker":  # also through the daemon's archive API (a remote daemon)
        readers.append(type(sb)(sb.id, sb.spec, sb.user, sb.workdir, sb._io_dir, sb.host))
    for reader in readers:
        with pytest.raises(OutputTooLarge, match="67,108,864-byte read limit"):
            await reader.read_file("/root/big")
        with pytest.raises(OutputTooLarge):
            await reader.download("/root/big", Path("/nonexistent/never-written"))
        assert await reader.read_file("/root/small") == b"small\n"
    assert await transfer(sb, sb, ["/root/big"]) == ["/root/big"]  # not copied: missing
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    assert grown < 200 * 1024, f"peak RSS grew {grown // 1024} MiB"
