"""The seccomp filter of bwrap sandboxes: the kernel surfaces Docker's default profile closes.

Docker's default profile is an allow-list of ~350 syscalls; what it leaves out that a process
without CAP_SYS_ADMIN could still reach is the part that matters, and that is what this
deny-list closes (EPERM): new namespaces (`unshare`, `clone` with namespace flags; `clone3`
answers ENOSYS so libc falls back to `clone`, exactly as under Docker), keyrings (not
namespaced), bpf, perf_event_open, userfaultfd, io_uring, open_by_handle_at, the new mount API,
module loading, kexec, reboot, swap, clocks, accounting and quotas. Calls through another
architecture's entry points (i386 `int 0x80`, x32) are refused: their numbers differ.

`setns` stays allowed: `nsenter` runs under the filter to join the sandbox, and a command has
no capability that would let it join anything.

The program is classic BPF, the format `bwrap --seccomp FD` reads (an array of
`struct sock_filter`). x86_64 only: other architectures number syscalls differently.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct

from ..errors import SandboxError

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data, little-endian

# clone(2) flags that make namespaces: CLONE_NEWTIME|NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|
# NEWPID|NEWNET
CLONE_NAMESPACES = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | \
    0x10000000 | 0x20000000 | 0x40000000
SYS_CLONE, SYS_CLONE3 = 56, 435
# x86_64 numbers of the refused calls
DENIED = {
    "syslog": 103, "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153,
    "pivot_root": 155, "_sysctl": 156, "adjtimex": 159, "acct": 163, "settimeofday": 164,
    "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
    "iopl": 172, "ioperm": 173, "create_module": 174, "init_module": 175,
    "delete_module": 176, "get_kernel_syms": 177, "query_module": 178, "quotactl": 179,
    "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "fanotify_init": 300, "open_by_handle_at": 304,
    "clock_adjtime": 305, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320,
    "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "quotactl_fd": 443,
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


@functools.cache
def program() -> bytes:
    """The compiled filter (see module doc)."""
    if platform.machine() != "x86_64":
        raise SandboxError(f"the bwrap backend's seccomp filter is built for x86_64; this host "
                           f"is {platform.machine()}: use backend='docker'")
    denied = sorted(DENIED.values())
    n = len(denied)
    # layout: [0-2] arch check, [3] load nr, [4] x32, [5] clone3, [6] clone, [7, 7+n) denied,
    # then ALLOW, the clone flag check (3), EPERM, ENOSYS
    allow = 7 + n
    clone_check = allow + 1
    eperm = clone_check + 3
    enosys = eperm + 1

    def to(target: int, pc: int) -> int:
        return target - pc - 1

    code = [_insn(_LD_ABS, _OFF_ARCH),
            _insn(_JEQ, AUDIT_ARCH_X86_64, jt=1),
            _insn(_RET, RET_KILL_PROCESS),
            _insn(_LD_ABS, _OFF_NR),
            _insn(_JGE, X32_SYSCALL_BIT, jt=to(eperm, 4)),
            _insn(_JEQ, SYS_CLONE3, jt=to(enosys, 5)),
            _insn(_JEQ, SYS_CLONE, jt=to(clone_check, 6))]
    code += [_insn(_JEQ, nr, jt=to(eperm, 7 + i)) for i, nr in enumerate(denied)]
    code += [_insn(_RET, RET_ALLOW),
             _insn(_LD_ABS, _OFF_ARG0),  # the low 32 bits of clone's flags
             _insn(_JSET, CLONE_NAMESPACES, jt=1),
             _insn(_RET, RET_ALLOW),
             _insn(_RET, RET_ERRNO | errno.EPERM),
             _insn(_RET, RET_ERRNO | errno.ENOSYS)]
    assert len(code) == enosys + 1 and max(to(enosys, 5), to(eperm, 7)) < 256
    return b"".join(code)


class ProgramFile:
    """The program in a memfd; `open()` gives a fresh descriptor at offset 0 for each bwrap
    (bwrap reads its FD to the end, and descriptors share their offset)."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("corral-seccomp", os.MFD_CLOEXEC)
        os.write(self.fd, program())

    def open(self) -> int:
        """A new read-only descriptor of the program (the caller closes it)."""
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)


@functools.cache
def program_file() -> ProgramFile:
    """The process-wide program file."""
    return ProgramFile()
