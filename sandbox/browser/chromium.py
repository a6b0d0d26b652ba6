"""Which Chromium runs, with which switches, and under which user: shared by the host launcher
(`pool.py`), the containerized launcher (`container.py`) and anything else that starts a
browser (the registry's web-catalog tests, the browser benchmarks)."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile

from ..cache import cache_dir

__all__ = ["CHROMIUM", "DROP_WRAPPER", "FULL_CHROMIUM", "HEADLESS_SHELL", "LAUNCH_ARGS",
           "PLAYWRIGHT_DISABLED", "UNPRIVILEGED", "chromium_sandbox_available", "sandboxed_launch"]

log = logging.getLogger(__name__)

FULL_CHROMIUM = "/usr/bin/chromium"
# Debian's headless shell (package chromium-headless-shell, the same build as chromium), the
# binary itself rather than its /usr/bin wrapper script (which stays alive as its parent): it
# has no browser UI layer to start and drive, so at equal load a warm reset takes about half
# the time and episodes/s are about 2.5x (docs/benchmarks.md). The full browser serves where
# the shell is missing.
HEADLESS_SHELL = "/usr/lib/chromium/chromium-headless-shell"
CHROMIUM = HEADLESS_SHELL if os.access(HEADLESS_SHELL, os.X_OK) else FULL_CHROMIUM
# Chromium keeps only the last --disable-features switch, and Playwright passes its own list
# first: ours repeats Playwright's (1.65: PaintHolding, ThirdPartyStoragePartitioning, the
# redirect fix for Fetch interception, ...) so that adding Translate does not drop them.
PLAYWRIGHT_DISABLED = ("AvoidUnnecessaryBeforeUnloadCheckSync", "DestroyProfileOnBrowserClose",
                       "HttpsUpgrades", "HttpsFirstBalancedModeAutoEnable", "LensOverlay",
                       "MediaRouter", "PaintHolding", "ThirdPartyStoragePartitioning",
                       "AvoidCorsURLLoaderRestartOnRedirect", "OptimizationHints",
                       "NetworkTimeServiceQuerying", "AimEnabled", "PreconnectToSearch")
# No --no-sandbox here: Playwright adds it unless asked for the sandbox (`HostLauncher` asks
# where the host allows it), and container mode adds it (the container is its sandbox).
# WebRTC may only use UDP through the proxy, which goes nowhere (`egress.py`): without this a
# page sends STUN datagrams to any address.
LAUNCH_ARGS = ("--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-quic",
               "--no-first-run",
               "--disable-features=" + ",".join(("Translate",) + PLAYWRIGHT_DISABLED),
               "--disable-extensions", "--mute-audio", "--disable-breakpad",
               "--force-webrtc-ip-handling-policy=disable_non_proxied_udp")

UNPRIVILEGED = 65534  # nobody / nogroup: who the host browser runs as when we are root
# Run as root, Chromium refuses its own sandbox; this wrapper (Playwright starts it in place
# of Chromium, with Chromium's arguments) gives Playwright's fresh profile directory to the
# unprivileged user and then becomes that user, with no capabilities, before exec'ing Chromium.
# The pipes Playwright drives the browser through (fds 3 and 4) pass through unchanged.
DROP_WRAPPER = """#!/bin/sh
for arg in "$@"; do
  case "$arg" in --user-data-dir=*) profile="${{arg#--user-data-dir=}}";; esac
done
[ -n "$profile" ] && chown -R {uid}:{uid} "$profile" && export HOME="$profile"
exec {setpriv} --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all \\
  --bounding-set=-all -- {chromium} "$@"
"""


@functools.cache
def chromium_sandbox_available() -> bool:
    """Whether Chromium's own sandbox can run here: it needs unprivileged user namespaces
    (Debian ships no setuid helper), and as root a drop to `UNPRIVILEGED` first (setpriv).
    Probed once per process (a few ms)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = [unshare, "--user", "true"]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            return False
        probe = [setpriv, f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}",
                 "--clear-groups", "--", *probe]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def _drop_wrapper(executable: str) -> str:
    """The path of a wrapper script that starts `executable` as `UNPRIVILEGED`: one file per
    script content in Corral's cache (shared by every process; a folder per process, never
    removed, piled up in /tmp), written atomically, readable by root alone."""
    script = DROP_WRAPPER.format(uid=UNPRIVILEGED, setpriv=shutil.which("setpriv"),
                                 chromium=executable)
    folder = cache_dir() / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"chromium-unprivileged-{hashlib.sha256(script.encode()).hexdigest()[:12]}"
    if not path.is_file():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".wrapper-")
        with os.fdopen(fd, "w") as f:
            f.write(script)
        os.chmod(tmp, 0o700)
        os.replace(tmp, path)  # concurrent writers write the same bytes
    return str(path)


def sandboxed_launch(executable: str = CHROMIUM, sandbox: bool | None = None) -> tuple[str, bool]:
    """(what to start, whether Chromium's sandbox is on) for a host browser. `sandbox=None`
    turns it on where the host allows it; False turns it off; True insists (an error from
    Chromium where the host cannot)."""
    on = chromium_sandbox_available() if sandbox is None else sandbox
    if not on:
        if sandbox is None:
            log.warning("Chromium runs without its sandbox: this host allows no unprivileged "
                        "user namespaces (docs/security.md)")
        return executable, False
    return (_drop_wrapper(executable) if os.geteuid() == 0 else executable), True
