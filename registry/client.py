"""`RegistryClient`: the registry server over HTTP, with the same methods as `LocalStore`.

Errors come back as the same exceptions a local store raises (the server sends the exception
name with its message); a server that is down or answers 5xx raises `RegistryUnavailable`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import httpx

from corral.errors import InvalidEnvId, RegistryError

from .errors import (AuthError, LimitExceeded, RegistryUnavailable, ReleaseError,
                     ReleaseNotFound, VersionConflict)
from .profiles import Profile
from .records import PublishResult, ReleaseRecord

__all__ = ["ERRORS", "RegistryClient"]

log = logging.getLogger(__name__)

ERRORS: dict[str, type[RegistryError]] = {cls.__name__: cls for cls in (
    AuthError, LimitExceeded, ReleaseError, ReleaseNotFound, VersionConflict, InvalidEnvId,
    RegistryError)}
_CHUNK = 1 << 20


class RegistryClient:
    """A registry server at `url`; `token` authorises publishing, yanking and profiles."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        try:
            self._http = httpx.Client(base_url=self.url, timeout=timeout)
        except httpx.InvalidURL as exc:
            raise RegistryError(f"registry URL {url!r} is not valid ({exc})") from None

    def __repr__(self) -> str:
        return f"RegistryClient({self.url!r})"

    @property
    def location(self) -> str:
        return self.url

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ----------------------------------------------------------------------------
    def _headers(self, token: str | None) -> dict[str, str]:
        token = token or self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.InvalidURL as exc:
            raise RegistryError(f"registry URL {self.url!r} is not valid ({exc})") from None
        except httpx.HTTPError as exc:
            raise RegistryUnavailable(f"registry {self.url} unreachable: {exc}") from None
        return _check(response, self.url)

    # --- the store interface -----------------------------------------------------------------
    def publish(self, archive: str | Path, *, token: str | None = None) -> PublishResult:
        """Upload a release archive (streamed)."""
        headers = {**self._headers(token), "Content-Type": "application/gzip"}
        response = self._request("PUT", "/api/releases", content=_chunks(Path(archive)),
                                 headers=headers)
        return PublishResult.model_validate_json(response.content)

    def get(self, sha: str) -> ReleaseRecord:
        """A release by hash (yanked or not)."""
        sha = sha.removeprefix("sha256:")
        return ReleaseRecord.model_validate_json(
            self._request("GET", f"/api/releases/{quote(sha)}").content)

    def resolve(self, ref: str) -> ReleaseRecord:
        return ReleaseRecord.model_validate_json(
            self._request("GET", "/api/resolve", params={"ref": ref}).content)

    def download(self, sha: str, dest: Path, *, max_bytes: int | None = None) -> Path:
        """Stream an archive into `dest`, refusing one over `max_bytes` as it arrives (a
        hostile or broken server cannot fill the disk)."""
        try:
            with self._http.stream("GET", f"/api/releases/{quote(sha)}/archive") as response:
                if response.status_code != 200:
                    response.read()
                    _check(response, self.url)
                size = 0
                with open(dest, "wb") as fh:
                    for chunk in response.iter_bytes(_CHUNK):
                        size += len(chunk)
                        if max_bytes is not None and size > max_bytes:
                            raise LimitExceeded(f"archive sha256:{sha[:12]}… from {self.url} is "
                                                f"over the {max_bytes:,}-byte limit")
                        fh.write(chunk)
        except httpx.HTTPError as exc:
            raise RegistryUnavailable(f"registry {self.url}: download failed: {exc}") from None
        return dest

    def releases(self, pattern: str | None = None, *,
                 include_yanked: bool = True) -> list[ReleaseRecord]:
        params: dict[str, Any] = {"include_yanked": include_yanked}
        if pattern:
            params["pattern"] = pattern
        data = self._request("GET", "/api/releases", params=params).json()
        return [ReleaseRecord.model_validate(item) for item in data]

    def search(self, query: str = "") -> list[ReleaseRecord]:
        data = self._request("GET", "/api/search", params={"q": query}).json()
        return [ReleaseRecord.model_validate(item) for item in data]

    def yank(self, ref: str, *, reason: str = "", token: str | None = None) -> ReleaseRecord:
        response = self._request("POST", "/api/yank", json={"ref": ref, "reason": reason},
                                 headers=self._headers(token))
        return ReleaseRecord.model_validate_json(response.content)

    def record_profile(self, profile: Profile, *, token: str | None = None) -> Profile:
        response = self._request("POST", "/api/profiles", content=profile.model_dump_json(),
                                 headers={**self._headers(token),
                                          "Content-Type": "application/json"})
        return Profile.model_validate_json(response.content)

    def profile(self, env_id: str, agent: str | None = None) -> Profile:
        """The env's profile; an env the registry does not know (404) has an empty one, as in
        a `LocalStore` (a mixture skips unprofiled envs)."""
        params = {"agent": agent} if agent else {}
        try:
            return Profile.model_validate_json(
                self._request("GET", f"/api/profiles/{env_id}", params=params).content)
        except ReleaseNotFound:
            return Profile(env_id=env_id, agent=agent or "random")

    def profile_agents(self, env_id: str) -> list[str]:
        """Who profiled the env; none for an env the registry does not know."""
        try:
            return self._request("GET", f"/api/profiles/{env_id}/agents").json()
        except ReleaseNotFound:
            return []


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            yield chunk


def _check(response: httpx.Response, url: str) -> httpx.Response:
    """Raise the error the server named, or `RegistryUnavailable` for 5xx."""
    if response.status_code < 400:
        return response
    try:
        body = response.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    detail = body.get("detail") or response.text[:200] or response.reason_phrase
    if response.status_code >= 500:
        raise RegistryUnavailable(f"registry {url} answered {response.status_code}: {detail}")
    if "error" not in body and response.status_code == 404:
        raise RegistryError(f"registry {url} answered {response.status_code} "
                            f"({str(detail)[:100]}): is it the base URL of `corral registry "
                            "serve`?")
    error = ERRORS.get(body.get("error", ""), RegistryError)
    if response.status_code in (401, 403):
        error = AuthError
    elif response.status_code == 413:
        error = LimitExceeded
    raise error(str(detail))
