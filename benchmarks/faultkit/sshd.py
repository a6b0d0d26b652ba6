"""A real OpenSSH server on 127.0.0.1, for the ssh:// sandbox-host tests.

`LocalSshd(root, docker_host)` starts `/usr/sbin/sshd -D -e` on a free port with everything
of its own under `root`: a host key (ssh-keygen), an `authorized_keys` holding one fresh
ed25519 client key, the pid file and the log. Root logs in by that key only (no passwords, no
PAM). Its sessions get `DOCKER_HOST=docker_host` (sshd's `SetEnv`), so `docker system
dial-stdio` on "the remote machine" reaches that daemon.

The client side is configuration, not a fake: `bin/ssh` under `root` is a launcher that execs
the real `/usr/bin/ssh` with `-F root/ssh_config` (that key, that known_hosts, nothing else).
Put `root/bin` first on PATH and both the docker SDK (`use_ssh_client=True` runs `ssh` from
PATH) and Corral's exec dialer go through the real ssh to the real sshd; root's own ~/.ssh is
never read or written. (The SDK builds `ssh [-l USER] [-p PORT] -- HOST docker system
dial-stdio` with no hook for options, and OpenSSH reads ~/.ssh from the passwd entry, not
$HOME: hence the launcher.)
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD, SSH = "/usr/sbin/sshd", "/usr/bin/ssh"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (just now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalSshd:
    """One sshd on 127.0.0.1 and the client configuration to reach it (module docstring)."""

    def __init__(self, root: Path, docker_host: str) -> None:
        self.root, self.docker_host = root, docker_host
        self.port = free_port()
        self.bin = root / "bin"
        self.log = root / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._configure()

    @property
    def url(self) -> str:
        """The Docker host URL of the daemon behind this sshd."""
        return f"ssh://root@127.0.0.1:{self.port}"

    def _keygen(self, name: str) -> str:
        """A fresh ed25519 key pair under root; returns the public key."""
        key = self.root / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f",
                        str(key)], check=True, capture_output=True)
        return key.with_suffix(".pub").read_text().strip()

    def _configure(self) -> None:
        r = self.root
        self.bin.mkdir(parents=True, exist_ok=True)
        host_pub = self._keygen("host_ed25519")
        (r / "authorized_keys").write_text(self._keygen("client_ed25519") + "\n")
        (r / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub}\n")
        (r / "sshd_config").write_text(
            f"ListenAddress 127.0.0.1\nPort {self.port}\nHostKey {r}/host_ed25519\n"
            f"PidFile {r}/sshd.pid\nAuthorizedKeysFile {r}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
            # the key files' parents include /tmp (mode 1777), which StrictModes refuses
            "StrictModes no\n"
            # INFO: one "Accepted publickey" line per session, which the tests count
            f"SetEnv DOCKER_HOST={self.docker_host}\nLogLevel INFO\n")
        (r / "ssh_config").write_text(
            f"Host 127.0.0.1\n  IdentityFile {r}/client_ed25519\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {r}/known_hosts\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 5\n"
            "  LogLevel ERROR\n")
        launcher = self.bin / "ssh"
        launcher.write_text("#!/bin/sh\n# the real ssh, with the sshd's client config (faultkit"
                            f"/sshd.py)\nexec {SSH} -F {r}/ssh_config \"$@\"\n")
        launcher.chmod(0o755)

    def start(self, limit: float = 10.0) -> None:
        """Start sshd and wait until it accepts connections."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                         stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not listen on 127.0.0.1:{self.port} in {limit:g} s")

    def sessions(self) -> int:
        """Logins accepted so far (from its log)."""
        return self.log.read_text().count("Accepted publickey for root")

    def clients(self) -> list[int]:
        """The ssh client processes (through the launcher) connected to it now."""
        config = f"{self.root}/ssh_config".encode()
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and config in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue  # exited meanwhile
        return found

    def stop(self) -> None:
        """Stop the listener (sessions open now end with their clients)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
            self.proc = None
