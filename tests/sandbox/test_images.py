"""Image building (content-hash caching, clear failures) and the CLI around it, for real."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from corral.errors import ImageBuildError, ImageNotFound
from corral.sandbox import open_sandbox
from corral.sandbox.baseimage import ensure_base_image
from corral.sandbox.builds import build_image, image_tag
from corral.sandbox.spec import Terminal


def _app() -> typer.Typer:
    from corral.cli.sandbox import register

    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """corral"""

    register(app)
    return app


def _image_ids(tag: str) -> str:
    return subprocess.run(["docker", "images", "-q", tag], capture_output=True,
                          text=True).stdout.strip()


async def test_ensure_base_image_is_cached(base_image):
    assert ensure_base_image() == base_image
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", base_image, "sh", "-c",
                        "id agent; python3 -c 'print(1)'; git --version"],
                       capture_output=True, text=True)
    assert "uid=1000(agent)" in r.stdout and "git version" in r.stdout


def test_build_caches_by_content(base_image, tmp_path):
    ctx = tmp_path / "hello-env"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {base_image}\nCOPY msg.txt /msg.txt\n")
    (ctx / "msg.txt").write_text("one\n")
    tag = build_image(ctx / "Dockerfile")
    assert tag.startswith("corral/env-hello-env:") and tag == image_tag(ctx / "Dockerfile")
    image_id = _image_ids(tag)
    lines: list[str] = []
    assert build_image(ctx / "Dockerfile", on_line=lines.append) == tag
    assert lines == [] and _image_ids(tag) == image_id  # unchanged: nothing was built
    (ctx / "msg.txt").write_text("two\n")
    changed = build_image(ctx / "Dockerfile")
    assert changed != tag and _image_ids(changed) != image_id
    r = subprocess.run(["docker", "run", "--rm", changed, "cat", "/msg.txt"],
                       capture_output=True, text=True)
    assert r.stdout == "two\n"
    subprocess.run(["docker", "rmi", "-f", tag, changed], capture_output=True)


def test_broken_dockerfile_names_file_and_step(base_image, tmp_path):
    df = tmp_path / "broken" / "Dockerfile"
    df.parent.mkdir()
    df.write_text(f"FROM {base_image}\nRUN echo fine\nRUN exit 3\n")
    with pytest.raises(ImageBuildError) as err:
        build_image(df)
    assert str(df) in str(err.value) and "RUN exit 3" in str(err.value)
    result = CliRunner().invoke(_app(), ["image", "build", "--dockerfile", str(df)])
    assert result.exit_code == 1 and str(df) in result.output


def test_unparsable_dockerfile_and_missing_context_are_build_errors(base_image, tmp_path):
    """docs/sandboxes.md: an ImageBuildError naming the file and the line (it was docker's
    APIError); a context that is not a folder is refused, not built as an empty one."""
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {base_image}\nCOPPY x y\n")
    with pytest.raises(ImageBuildError, match="line 2: unknown instruction: COPPY") as err:
        build_image(df)
    assert str(df) in str(err.value)
    with pytest.raises(ImageBuildError, match="no such folder for the build context"):
        build_image(df, tmp_path / "nothing")
    result = CliRunner().invoke(_app(), ["image", "build", "--dockerfile", str(df), "--context",
                                         str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "'--context'" in result.output, result.output


def test_missing_from_image_names_the_command(dockerd, tmp_path):
    df = tmp_path / "Dockerfile"
    df.write_text("FROM corral/env-nothing-here:000000000000\n")
    with pytest.raises(ImageBuildError, match="not present locally"):
        build_image(df)


async def test_missing_image_names_the_command(dockerd, run_id):
    # no recipe: `corral image build acme/none-v1` could not make it either
    with pytest.raises(ImageNotFound, match=r"docker build -t corral/env-none:abc \."):
        await open_sandbox(Terminal(image="corral/env-none:abc"), "docker", run_id=run_id,
                           env_id="acme/none-v1")
    from corral.sandbox.builds import missing_image

    assert "`corral image base`" in str(missing_image("corral/base:bookworm"))


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
async def test_spec_with_dockerfile_builds_on_first_use(base_image, run_id, tmp_path, backend):
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {base_image}\nRUN echo built > /built.txt\n")
    async with await open_sandbox(Terminal(dockerfile=str(df)), backend, run_id=run_id) as sb:
        assert (await sb.exec("cat /built.txt")).stdout == "built\n"
    subprocess.run(["docker", "rmi", "-f", image_tag(df)], capture_output=True)


async def test_gc_removes_a_runs_orphans(base_image, run_id):
    from corral.sandbox.bwrap import sandboxes_dir

    orphan_run = f"{run_id}-orphans"
    spec = Terminal(image=base_image)
    docker_sb = await open_sandbox(spec, "docker", run_id=orphan_run)
    bwrap_sb = await open_sandbox(spec, "bwrap", run_id=orphan_run)
    try:
        result = CliRunner().invoke(_app(), ["sandbox", "gc", "--run", orphan_run])
        assert result.exit_code == 0, result.output
        assert "removed 1 containers, 1 bwrap" in result.output
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={orphan_run}"],
                              capture_output=True, text=True).stdout
        assert left.strip() == ""
        assert not list(sandboxes_dir().glob(f"{orphan_run}-*"))
    finally:
        await docker_sb.close()
        await bwrap_sb.close()


async def test_gc_spares_live_sandboxes_and_reaps_dead_owners(base_image, run_id):
    from corral.sandbox.bwrap import sandboxes_dir
    from corral.sandbox.containers import io_root
    from corral.sandbox.reaper import gc

    dead_run = f"{run_id}-dead"
    script = ("import asyncio, os\nfrom corral.sandbox import open_sandbox\n"
              "from corral.sandbox.spec import Terminal\n"
              "async def main():\n"
              f"    spec = Terminal(image={base_image!r})\n"
              f"    await open_sandbox(spec, 'docker', run_id={dead_run!r})\n"
              f"    await open_sandbox(spec, 'bwrap', run_id={dead_run!r})\n"
              "    os._exit(0)\n"
              "asyncio.run(main())\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    live = await open_sandbox(Terminal(image=base_image), "docker", run_id=run_id)
    live_bwrap = await open_sandbox(Terminal(image=base_image), "bwrap", run_id=run_id)
    # dirs without an owner file: one being created right now (spared), one long abandoned
    being_made = sandboxes_dir() / f"{run_id}-being-made"
    abandoned = sandboxes_dir() / f"{run_id}-abandoned"
    for d in (being_made, abandoned):
        d.mkdir(parents=True)
    # shell pipe dirs: a live container's (old, kept) and one whose container is gone
    pipes_gone = io_root() / f"{run_id}-gone"
    pipes_gone.mkdir(parents=True)
    for d in (abandoned, live._io_dir, pipes_gone):
        os.utime(d, (time.time() - 600, time.time() - 600))
    try:
        report = gc()
        assert report.containers >= 1 and report.bwrap_dirs >= 2
        left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={dead_run}"],
                              capture_output=True, text=True).stdout
        assert left.strip() == ""
        assert (await live.exec("echo alive")).stdout == "alive\n"  # ours were spared
        assert (await live_bwrap.exec("echo alive")).stdout == "alive\n"
        assert being_made.is_dir() and not abandoned.exists()
        assert live._io_dir.is_dir() and not pipes_gone.exists()
    finally:
        await live.close()
        await live_bwrap.close()
        shutil.rmtree(being_made, ignore_errors=True)


@pytest.mark.bwrap
async def test_a_process_killed_while_removing_its_bwrap_sandbox_leaves_it_reapable(base_image,
                                                                                  run_id):
    """SIGKILL lands while `close` is deleting the sandbox dir: what is left (part of the dir,
    its owner record) is still attributed to the dead owner, so the run's reap removes it."""
    from corral.sandbox.bwrap import owner_record
    from corral.sandbox.reaper import reap_run

    killed_run, files = f"{run_id}-killed", 30000
    script = ("import asyncio\nfrom corral.sandbox import open_sandbox\n"
              "from corral.sandbox.spec import Terminal\n"
              "async def main():\n"
              f"    sb = await open_sandbox(Terminal(image={base_image!r}), 'bwrap', "
              f"run_id={killed_run!r})\n"
              f"    await sb.exec('mkdir /many && cd /many && seq {files} | xargs touch')\n"
              "    print(sb.dir, flush=True)\n"
              "    await sb.close()\n"
              "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        sbdir = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
        many = sbdir / "upper" / "many"
        deadline = time.monotonic() + 60
        while True:  # kill once the removal has begun on the many files
            assert proc.poll() is None, "the close ended before the kill"
            assert time.monotonic() < deadline, "the close did not start in 60 s"
            with contextlib.suppress(FileNotFoundError):
                if len(os.listdir(many)) < files:
                    break
        proc.kill()
        proc.wait()
        assert sbdir.is_dir(), "the kill must land while the dir is being removed"
        report = reap_run(killed_run)
        assert report.bwrap_dirs == 1
        assert not sbdir.exists() and not owner_record(sbdir).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.bwrap
def test_owner_records_without_dirs_go_once_their_owner_is_gone(run_id):
    """A process killed just before making its sandbox dir (or just after removing it) leaves
    only its owner record: reaped like a dir; a record still being written is spared."""
    from corral.sandbox.bwrap import owner_record, sandboxes_dir
    from corral.sandbox.reaper import gc_bwrap

    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout
    run = f"{run_id}-records"
    sandboxes_dir().mkdir(parents=True, exist_ok=True)
    orphan = owner_record(sandboxes_dir() / f"{run}-orphan")
    orphan.write_text(json.dumps({"pid": int(dead), "run": run}))
    being_written = owner_record(sandboxes_dir() / f"{run}-being-written")
    being_written.write_text("")
    try:
        assert gc_bwrap(run, orphans_only=True) == (0, 0)
        assert not orphan.exists() and being_written.exists()
    finally:
        being_written.unlink(missing_ok=True)
        orphan.unlink(missing_ok=True)


@pytest.mark.bwrap
async def test_rootfs_exports_of_removed_images_are_pruned_unless_in_use(base_image, run_id,
                                                                        tmp_path):
    """Every rebuilt image used by the bwrap backend adds an export (and its uid-shifted copy)
    to the cache: once the daemon no longer holds the image, the reaper removes them, but
    never one a live sandbox runs on, one used in the grace period, or one of a held image."""
    from corral.sandbox.cache import cache_dir
    from corral.sandbox.reaper import gc, prune_rootfs

    def export_of(tag: str) -> Path:
        digest = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag],
                                capture_output=True, text=True, check=True).stdout.strip()
        return cache_dir() / "rootfs" / digest.split(":")[-1]

    def age(export: Path) -> None:
        old = time.time() - 3600
        os.utime(export.parent / f"{export.name}.json", (old, old))

    exports = []
    for i in range(2):  # two images of their own (a label makes a new image id, no new layer)
        (tmp_path / f"Dockerfile{i}").write_text(f"FROM {base_image}\nLABEL prune={run_id}-{i}\n")
        tag = build_image(tmp_path / f"Dockerfile{i}", tmp_path, name=f"prune{i}")
        exports.append((tag, export_of(tag)))
    held = export_of(base_image)
    running = await open_sandbox(Terminal(image=exports[0][0]), "bwrap", run_id=run_id)
    closed = await open_sandbox(Terminal(image=exports[1][0]), "bwrap", run_id=run_id)
    await closed.close()
    for tag, export in exports:
        assert export.is_dir() and list(export.parent.glob(f"{export.name}.uid*"))
        subprocess.run(["docker", "rmi", tag], check=True, capture_output=True)
    try:
        prune_rootfs()
        assert all(export.is_dir() for _, export in exports)  # both used just now
        for _, export in exports:
            age(export)
        age(held)
        assert prune_rootfs() >= 1  # (with any other idle export of a removed image)
        (_, in_use), (_, unused) = exports
        assert not unused.exists() and not list(unused.parent.glob(f"{unused.name}*"))
        assert in_use.is_dir() and held.is_dir()
        assert (await running.exec("cat /etc/os-release")).exit_code == 0
    finally:
        await running.close()
    assert gc().rootfs_exports >= 1
    assert not list(in_use.parent.glob(f"{in_use.name}*"))
    assert held.is_dir()


def test_images_names_every_function_of_its_modules_as_before():
    # `corral.sandbox.images` was one module; its jobs moved to their own modules, and every
    # public name still imports from `images`, as the very object its module defines
    from corral.sandbox import baseimage, builds, cache, daemon, images, rootfs

    for module in (baseimage, builds, cache, daemon, rootfs):
        for name in module.__all__:
            assert getattr(images, name) is getattr(module, name), name
    assert set(images.__all__) == {n for m in (baseimage, builds, cache, daemon, rootfs)
                                   for n in m.__all__}
