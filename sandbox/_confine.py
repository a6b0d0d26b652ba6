"""What the bwrap backend adds to bubblewrap so that the sandbox's root is not the host's root.

- **A user namespace with a range mapping.** In-sandbox uids 0..65535 are host uids
  `uid_base()`..+65535 (default 1342177280, `$CORRAL_BWRAP_UID_BASE` to move it), the way
  Docker's userns-remap and rootless Podman do it. bubblewrap runs as host uid `uid_base()`
  (dropped from root before it starts) with `--unshare-user --userns-block-fd`; the host writes
  the range into the new namespace's uid_map/gid_map (only root may map a range), then lets
  bubblewrap go on. The agent's root holds capabilities only inside that namespace: host files,
  sysctls and devices see an unprivileged uid.
- **A rootfs owned by the mapped uids** (`shifted_rootfs`): a copy of the exported image whose
  owners are shifted by the base, made once per image and cached beside the export; otherwise
  every file of the image would belong to an unmapped uid (`nobody`) inside the sandbox.
- **/proc as Docker leaves it** (`proc_args`): read-only /proc/sys, /proc/sysrq-trigger,
  /proc/irq, /proc/bus, /proc/fs; /proc/kcore, /proc/keys, /proc/timer_list and the like
  masked with /dev/null, /proc/acpi and /proc/scsi with an empty read-only tmpfs. bwrap mounts
  no /sys, so there is no /sys/firmware to mask.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from ..errors import SandboxError

DEFAULT_UID_BASE = 0x50000000  # above the ranges useradd and systemd hand out
ID_RANGE = 65536
READ_ONLY_PROC = ("sys", "sysrq-trigger", "irq", "bus", "fs")
MASKED_PROC_FILES = ("kcore", "keys", "timer_list", "timer_stats", "latency_stats",
                     "sched_debug")
MASKED_PROC_DIRS = ("acpi", "scsi", "asound")


def uid_base() -> int:
    """The host uid of the sandbox's root (also its gid)."""
    raw = os.environ.get("CORRAL_BWRAP_UID_BASE", str(DEFAULT_UID_BASE))
    try:
        base = int(raw, 0)
    except ValueError:
        raise SandboxError(f"CORRAL_BWRAP_UID_BASE={raw!r} is not a number") from None
    if not ID_RANGE <= base <= 0xFFFFFFFE - ID_RANGE:
        raise SandboxError(f"CORRAL_BWRAP_UID_BASE={base} must leave a free range of {ID_RANGE}"
                           " uids above it and not include root")
    return base


def write_id_maps(pid: int, base: int) -> None:
    """Map in-sandbox ids 0..65535 to host ids base..base+65535 for `pid`'s user namespace
    (setgroups stays allowed: `setpriv --init-groups` needs it for non-root users)."""
    line = f"0 {base} {ID_RANGE}\n"
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(line)


def shifted_rootfs(rootfs: Path, base: int) -> Path:
    """`rootfs` with every owner moved up by `base`, made once beside it (`<id>.uid<base>`).

    Concurrent callers race safely: each shifts its own copy and the first rename wins.
    """
    final = rootfs.with_name(f"{rootfs.name}.uid{base}")
    if final.is_dir():
        return final
    tmp = Path(tempfile.mkdtemp(dir=rootfs.parent, prefix=f".tmp-{rootfs.name[:12]}-uid-"))
    try:
        copy = tmp / "root"
        # reflinks where the filesystem has them; owners are rewritten below either way
        done = subprocess.run(["cp", "-a", "--reflink=auto", str(rootfs), str(copy)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SandboxError(f"copying {rootfs} for the user namespace failed: "
                               f"{done.stderr.strip()}")
        _shift_owners(copy, base)
        try:
            copy.rename(final)
        except OSError:  # another process finished first: theirs is identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _shift_owners(root: Path, base: int) -> None:
    def shift(path: str) -> None:
        st = os.lstat(path)
        os.lchown(path, st.st_uid + base, st.st_gid + base)
        if not stat.S_ISLNK(st.st_mode):  # chown clears setuid/setgid bits: put them back
            os.chmod(path, stat.S_IMODE(st.st_mode))

    shift(str(root))
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:  # each entry once: a dir here is not `parent` again
            shift(os.path.join(parent, name))


def proc_args(proc: Path = Path("/proc")) -> list[str]:
    """bwrap arguments that make /proc what Docker leaves of it (module doc). Entries this
    kernel lacks are skipped (bwrap cannot create files inside procfs)."""
    args: list[str] = []
    for name in READ_ONLY_PROC:
        if (proc / name).exists():
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    for name in MASKED_PROC_FILES:
        if (proc / name).exists():
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    for name in MASKED_PROC_DIRS:
        if (proc / name).is_dir():
            args += ["--perms", "0555", "--tmpfs", f"/proc/{name}", "--remount-ro",
                     f"/proc/{name}"]
    return args
