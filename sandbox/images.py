"""Local images for terminal sandboxes, by one name: re-exports what its modules define.

No container registry is reachable, so nothing ever pulls. Each job has its own module:

- `daemon.py`: the Docker client, waiting out a restarting daemon, `docker_available()`,
  `image_exists(tag)`.
- `baseimage.py`: `ensure_base_image()` creates `corral/base:bookworm` with debootstrap +
  `docker import`. CLI: `corral image base`.
- `builds.py`: `build_image(dockerfile)` builds and tags `corral/env-<name>:<hash12>` (content
  hash of the Dockerfile and its context), on BuildKit with the host's trust as secrets when
  asked (`buildkit.py`); `missing_image` names the command that makes one.
  CLI: `corral image build --dockerfile PATH [--host-trust]`.
- `rootfs.py`: `export_rootfs(image)` unpacks an image once per id for the bwrap backend;
  `prune_exports(keep)` removes the exports of images the daemon no longer holds.
- `cache.py`: `cache_dir()`, the root of Corral's caches.
"""

from __future__ import annotations

from .baseimage import (AGENT_UID, BASE_IMAGE, BASE_PACKAGES, DEFAULT_MIRROR, apt_mirror,
                        ensure_base_image)
from .builds import (HOST_TRUST_VAR, build_hint, build_image, image_tag, missing_image,
                     recipe_hash)
from .cache import cache_dir
from .daemon import (DAEMON_WAIT_S, LABEL_MANAGED, daemon_call, daemon_unreachable,
                     docker_available, docker_client, image_exists, wait_for_daemon)
from .rootfs import (cached_rootfs, export_rootfs, image_config, passwd_entry, prune_exports,
                     rootfs_config, touch_export)

__all__ = ["AGENT_UID", "BASE_IMAGE", "BASE_PACKAGES", "DAEMON_WAIT_S", "DEFAULT_MIRROR",
           "HOST_TRUST_VAR", "LABEL_MANAGED", "apt_mirror", "build_hint", "build_image",
           "cache_dir", "cached_rootfs", "daemon_call", "daemon_unreachable", "docker_available",
           "docker_client", "ensure_base_image", "export_rootfs", "image_config", "image_exists",
           "image_tag", "missing_image", "passwd_entry", "prune_exports", "recipe_hash",
           "rootfs_config", "touch_export", "wait_for_daemon"]
