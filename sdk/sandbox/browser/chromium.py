"""Which Chromium runs and with which switches: shared by the host launcher (`pool.py`), the
containerized launcher (`container.py`) and anything else that starts a browser (the registry's
web-catalog tests, the browser benchmarks)."""

from __future__ import annotations

import os

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
LAUNCH_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--disable-quic",
               "--no-first-run",
               "--disable-features=" + ",".join(("Translate",) + PLAYWRIGHT_DISABLED),
               "--disable-extensions", "--mute-audio", "--disable-breakpad")
