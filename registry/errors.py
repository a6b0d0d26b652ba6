"""Errors of releases, stores and the registry server, under the `corral.errors` hierarchy.

Refusals of bad input (`ReleaseError` and its `LimitExceeded`, `VersionConflict`, `AuthError`)
are `RegistryError`s; a registry server that cannot be reached or answers 5xx is an `InfraError`.
"""

from __future__ import annotations

from corral.errors import InfraError, RegistryError

__all__ = ["AuthError", "LimitExceeded", "LockError", "MissingToken", "RegistryUnavailable",
           "ReleaseError", "ReleaseNotFound", "VersionConflict"]


class ReleaseError(RegistryError, ValueError):
    """A release archive or manifest is malformed, unsafe or inconsistent; nothing was written."""


class LimitExceeded(ReleaseError):
    """A release, one of its archive headers or a manifest field is over a size limit of
    `Limits` (HTTP 413); refused before the oversized part was read or stored."""


class VersionConflict(RegistryError):
    """This id and version are already published with different content (HTTP 409)."""


class AuthError(RegistryError, PermissionError):
    """A publishing token is missing, wrong, or not scoped to the release's namespace."""


class ReleaseNotFound(RegistryError, LookupError):
    """No (visible) release matches a reference."""


class LockError(RegistryError):
    """An environment is not pinned in `corral.lock`, or is pinned to another release."""


class RegistryUnavailable(InfraError):
    """The registry server could not be reached or answered with a server error."""


class MissingToken(AuthError):
    """A request that needs a publishing token came without one (HTTP 401)."""
