"""`Sandbox.fork(n)`, `snapshot()` and `restore` on the real backends (issue 32, item 1):
children see the parent's filesystem as it was at the call and nothing of each other's or the
parent's later changes; closing the parent leaves them working; the reaper removes the layers a
SIGKILLed process left. The containment suite runs on forked sandboxes too
(tests/faults/test_containment.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from corral.errors import SandboxError
from corral.sandbox import SandboxOpener, SandboxSnapshot, make_backend, restore_sandbox
from corral.sandbox import _layers
from corral.sandbox.reaper import gc, reap_run

backends = pytest.mark.parametrize("backend", ["docker", "bwrap"])

VIEW = "{ cat /w/shared.txt; stat -c %a /w/shared.txt; ls /w; cat /w/dir/f; ls /etc/issue; } 2>&1"


async def out(sb, command: str) -> str:
    return (await sb.exec(command, timeout=30)).output


@backends
async def test_a_childs_writes_deletes_and_chmods_stay_its_own(make_sandbox, backend) -> None:
    parent = await make_sandbox(backend, files={"/w/shared.txt": "base\n", "/w/gone.txt": "x"})
    await out(parent, "mkdir -p /w/dir && echo deep > /w/dir/f && rm /etc/issue")
    a, b = await parent.fork(2)
    try:
        assert a.spec == b.spec == parent.spec and a.can_fork
        await out(a, "echo a >> /w/shared.txt && chmod 600 /w/shared.txt && rm /w/gone.txt && "
                     "rm -r /w/dir && touch /w/a-only && echo back > /etc/issue")
        await out(parent, "touch /w/parent-only && chmod 640 /w/shared.txt")
        assert await out(a, VIEW) == ("base\na\n600\na-only\nshared.txt\ncat: /w/dir/f: No such "
                                      "file or directory\n/etc/issue\n")
        # b: the parent's files at the call, none of a's or the parent's changes since
        assert await out(b, VIEW) == ("base\n644\ndir\ngone.txt\nshared.txt\ndeep\nls: cannot "
                                      "access '/etc/issue': No such file or directory\n")
        assert await out(parent, VIEW) == ("base\n640\ndir\ngone.txt\nparent-only\nshared.txt\n"
                                           "deep\nls: cannot access '/etc/issue': No such file "
                                           "or directory\n")
        await b.write_file("/w/from-host", b"b")  # the host-side file API works on a child
        assert await b.read_file("/w/from-host") == b"b"
        with pytest.raises(FileNotFoundError):
            await a.read_file("/w/from-host")
    finally:
        await asyncio.gather(a.close(), b.close())


LIMITS = ("Memory", "MemorySwap", "PidsLimit", "NanoCpus", "CapAdd", "CapDrop", "SecurityOpt",
          "NetworkMode", "Init", "Privileged", "ReadonlyPaths", "MaskedPaths")


def _limits(sb) -> dict:
    """What bounds a sandbox, read on the host: its container's host config, or its cgroup."""
    if sb.backend == "docker":
        inspect = subprocess.run(["docker", "inspect", sb.id], capture_output=True, text=True)
        config = json.loads(inspect.stdout)[0]["HostConfig"]
        return {key: config[key] for key in LIMITS}
    return {f"{d.parent.parent.name}/{f.name}": f.read_text() for d in sb.cgroup.dirs
            for f in sorted(d.iterdir()) if f.name.split(".")[-1] in ("max", "limit_in_bytes",
                                                                       "cfs_quota_us")}


@backends
async def test_a_child_is_bounded_as_its_parent(make_sandbox, backend) -> None:
    parent = await make_sandbox(backend, memory="256m", pids=64, cpus=0.5)
    (child,) = await parent.fork(1)
    try:
        assert child.spec == parent.spec
        assert _limits(child) == _limits(parent) and _limits(child)
        # network off: the loopback device alone, as in the parent
        devices = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
        assert await out(child, devices) == await out(parent, devices) == "lo\n"
        assert await out(child, "id -u") == "0\n"
    finally:
        await child.close()


@backends
async def test_closing_the_parent_leaves_the_children_working(make_sandbox, backend) -> None:
    parent = await make_sandbox(backend, files={"/w/f": "1\n"})
    (child,) = await parent.fork(1)
    await parent.close()
    try:
        assert await out(child, "cat /w/f; echo 2 > /w/g; cat /w/g") == "1\n2\n"
        grand = await child.fork(2, keep_parent=False)  # the child closes with this fork
        assert not child.alive
        try:
            assert [await out(g, "cat /w/f /w/g") for g in grand] == ["1\n2\n"] * 2
        finally:
            await asyncio.gather(*(g.close() for g in grand))
    finally:
        await child.close()


@backends
async def test_a_snapshot_restores_in_another_backend_object(make_sandbox, backend,
                                                             run_id) -> None:
    parent = await make_sandbox(backend, files={"/w/f": "snap"})
    snap = await parent.snapshot()
    await out(parent, "echo later > /w/f")
    restored = None
    try:
        again = SandboxSnapshot.from_json(snap.to_json())
        assert again == snap and again.backend == backend
        restored = await restore_sandbox(again, run_id=run_id)
        assert await out(restored, "cat /w/f") == "snap"
        async with SandboxOpener(run_id=run_id) as opener:  # a runner's way: its backends
            async with await opener.restore(again) as second:
                assert await out(second, "cat /w/f") == "snap"
                assert await out(restored, "echo mine > /w/f; cat /w/f") == "mine\n"
                assert await out(second, "cat /w/f") == "snap"
        with pytest.raises(SandboxError, match="cannot be restored on the"):
            other = "bwrap" if backend == "docker" else "docker"
            await make_backend(other, run_id=run_id).restore(snap)
    finally:
        if restored is not None:
            await restored.close()
        await snap.discard()
        await snap.discard()  # idempotent


async def test_bwrap_layers_stay_few_and_show_the_right_files(make_sandbox) -> None:
    sb = await make_sandbox("bwrap", files={"/w/keep": "k"})
    await out(sb, "mkdir -p /w/d && touch /w/d/old")
    for i in range(_layers.MAX_DEPTH + 2):  # one squash, then a fork over the squashed layer
        # a new file, the previous one deleted (a whiteout), /w/d replaced (an opaque dir)
        await out(sb, f"touch /w/f{i} && rm -f /w/f{i - 1} && rm -r /w/d && mkdir /w/d && "
                      f"touch /w/d/n{i} && chmod 70{i % 8} /w/d")
        (sb,) = await sb.fork(1, keep_parent=False)
        assert 1 <= len(sb.stack) <= _layers.MAX_DEPTH
    try:
        assert await out(sb, "ls /w /w/d; stat -c %a /w/d") == \
            f"/w:\nd\nf{i}\nkeep\n\n/w/d:\nn{i}\n70{i % 8}\n"
    finally:
        await sb.close()
    left = {p.name for p in _layers.layers_dir().iterdir()} if _layers.layers_dir().is_dir() \
        else set()
    assert not {p.name for p in sb.stack} & left  # the last child's layers went with it


@backends
async def test_a_fork_remembers_what_changed_before_it(make_sandbox, backend) -> None:
    import time

    sb = await make_sandbox(backend, files={"/w/setup": "s"})
    since = time.time()
    await out(sb, "echo agent > /w/agent && rm /etc/issue")
    (child,) = await sb.fork(1)
    try:
        await out(child, "touch /w/after")
        changed = await child.changed_since(since)
        assert {"/w/agent", "/etc/issue", "/w/after"} <= set(changed)
        assert "/w/setup" not in changed
    finally:
        await child.close()


REAPED = textwrap.dedent("""
    import asyncio, json, sys
    from corral.sandbox import open_sandbox
    from corral.sandbox.spec import Terminal

    async def main():
        made = {}
        for backend in ("bwrap", "docker"):
            sb = await open_sandbox(Terminal(image=sys.argv[1]), backend, run_id=sys.argv[2])
            await sb.exec("echo x > /root/x")
            kids = await sb.fork(2)
            await kids[0].exec("echo kid > /root/x")
            # bwrap: the durable snapshot is a child's, so it stands on the fork's layer
            durable = await (kids[0] if backend == "bwrap" else sb).snapshot(durable=True)
            lost = await sb.snapshot()
            made[backend] = {"fork": sorted({getattr(k, "forked_from", "") or str(k.stack[0])
                                             for k in kids}),
                             "durable": durable.to_json(), "lost": lost.ref}
            if backend == "bwrap":  # as if killed mid-snapshot: its processes left frozen
                assert sb.cgroup.freeze(True)
                procs = sb.cgroup.dirs[0] / "cgroup.procs"
                made["bwrap"]["frozen_pids"] = procs.read_text().split()
        print(json.dumps(made), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def _running(pid: str) -> bool:
    """The process runs (a zombie, dead but not yet waited for by init, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _images(run: str) -> set[str]:
    listed = subprocess.run(["docker", "images", "-q", "--no-trunc", "--filter",
                             f"label=corral.run={run}"], capture_output=True, text=True)
    return set(listed.stdout.split())


async def test_the_reaper_removes_forked_layers_after_a_sigkill(base_image, run_id) -> None:
    run = f"{run_id}-forkreap"
    proc = subprocess.Popen([sys.executable, "-c", REAPED, base_image, run],
                            stdout=subprocess.PIPE, text=True)
    try:
        made = json.loads(await asyncio.to_thread(proc.stdout.readline))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    durable = {b: SandboxSnapshot.from_json(made[b]["durable"]) for b in made}
    (fork_layer,) = map(Path, made["bwrap"]["fork"])
    lost, kept = Path(made["bwrap"]["lost"]), Path(durable["bwrap"].ref)
    assert durable["bwrap"].extra["below"] == [str(fork_layer)]
    assert all(p.is_dir() for p in (fork_layer, lost, kept))
    assert _images(run) == {*made["docker"]["fork"], made["docker"]["lost"],
                            durable["docker"].ref}
    frozen_pids = made["bwrap"]["frozen_pids"]
    assert frozen_pids
    report = reap_run(run)  # what a resumed run does first: durable snapshots stay
    assert report.bwrap_dirs == 3 and report.containers == 3
    # a frozen sandbox takes no SIGKILL: the reaper thaws it first, then its processes die
    assert report.cgroups >= 3
    assert not [pid for pid in frozen_pids if _running(pid)]
    assert report.bwrap_layers == 1 and report.fork_images == 2
    assert not lost.exists() and not _layers.layer_record(lost).exists()
    assert kept.is_dir() and fork_layer.is_dir()  # the durable one needs the layer below it
    assert _images(run) == {durable["docker"].ref}
    for backend, snap in durable.items():  # a resumed run restores what the dead one kept
        restored = await restore_sandbox(snap)
        try:
            assert await out(restored, "cat /root/x") == ("kid\n" if backend == "bwrap"
                                                          else "x\n")
        finally:
            await restored.close()
    report = gc(run=run)  # only `gc --run` removes them
    assert report.bwrap_layers == 2 and report.fork_images == 1
    assert not any(p.exists() or _layers.layer_record(p).exists() for p in (kept, fork_layer))
    assert not _images(run)


def test_the_reaper_drops_change_times_of_images_gone_by_other_means(dockerd) -> None:
    from corral.sandbox._dockerfork import changes_file
    from corral.sandbox.reaper import gc_images

    stale, fresh = changes_file("sha256:" + "0" * 64), changes_file("sha256:" + "1" * 64)
    stale.parent.mkdir(parents=True, exist_ok=True)
    for record in (stale, fresh):
        record.write_text("{}")
    os.utime(stale, (0, 0))  # long ago: its image is not being made any more
    try:
        gc_images()
        assert not stale.exists() and fresh.exists()  # the young one may be being made
    finally:
        fresh.unlink(missing_ok=True)
