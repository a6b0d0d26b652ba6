"""The registry server: a FastAPI app over a `LocalStore`, with token auth and the web catalog.

    corral registry serve --registry /srv/corral --port 8080 --token acme:s3cret

API (JSON unless noted; errors are `{"error": <exception name>, "detail": <one line>}`, a
malformed request too: a 422 `RequestValidationError` naming the field, see `_invalid_request`):

    PUT  /api/releases                 body: a release archive; needs a token for its namespace
    GET  /api/releases[?pattern=&include_yanked=]      GET /api/releases/{sha}
    GET  /api/releases/{sha}/archive   the archive bytes (yanked ones too, by hash)
    GET  /api/resolve?ref=             GET /api/search?q=
    POST /api/yank {"ref", "reason"}   POST /api/profiles (a Profile)
    GET  /api/profiles/{ns}/{name}[?agent=]             GET /api/health
    GET  /api/profiles/{ns}/{name}/agents   (both 404 for an env with no release or profile)
    GET  /api/cards/{ns}/{name}[?version=]  a release's dataset card with its recorded profiles

Uploads stream into the store's temp folder and are committed by `LocalStore.add_temp` (verify,
atomic rename, one SQLite transaction): a server killed mid-upload shows no partial release,
and the stale temp file is removed at the next start (`LocalStore.recover`, from `create_app`).
Archives are read under `Limits` while streaming (`tarstream`): an over-limit header, member
count, path or manifest field is refused with 413 before it is buffered, and nothing is stored.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path
from typing import Any, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel

from corral.errors import CorralError, InvalidEnvId, RegistryError

from .errors import (AuthError, LimitExceeded, MissingToken, ReleaseError, ReleaseNotFound,
                     VersionConflict)
from .profiles import Profile
from .records import ReleaseRef
from .store import LocalStore

__all__ = ["Tokens", "YankRequest", "create_app", "serve"]

log = logging.getLogger(__name__)

_STATUS: list[tuple[type[Exception], int]] = [
    (MissingToken, 401), (AuthError, 403), (ReleaseNotFound, 404), (VersionConflict, 409),
    (LimitExceeded, 413),
    (ReleaseError, 400), (InvalidEnvId, 400), (RegistryError, 400), (CorralError, 400)]


class Tokens:
    """Publishing tokens, each scoped to namespaces (`*` = every namespace)."""

    def __init__(self, grants: dict[str, set[str]] | None = None) -> None:
        self.grants = {token: set(spaces) for token, spaces in (grants or {}).items()}

    @classmethod
    def parse(cls, specs: Iterable[str]) -> "Tokens":
        """From `namespace:token` strings (one namespace per string; repeat to add more)."""
        grants: dict[str, set[str]] = {}
        for spec in specs:
            namespace, sep, token = spec.partition(":")
            if not sep or not namespace or len(token) < 8:
                # The spec is not quoted: its token part is a secret (a typo of a real one).
                shown = f"'{namespace}:<{len(token)} characters>'" if sep else \
                    f"<{len(spec)} characters, no ':'>"
                raise AuthError(f"token spec {shown} must be 'namespace:token' with a token of "
                                "8+ characters ('*:token' for every namespace)")
            grants.setdefault(token, set()).add(namespace)
        return cls(grants)

    def check(self, token: str | None, namespace: str | None = None) -> None:
        """Raise unless `token` is known (and scoped to `namespace` when given)."""
        if not token:
            raise MissingToken("this request needs a publishing token: pass --token or set "
                               "CORRAL_TOKEN (header 'Authorization: Bearer <token>')")
        spaces = next((s for t, s in self.grants.items() if hmac.compare_digest(t, token)), None)
        if spaces is None:
            raise AuthError("the publishing token is not valid for this registry")
        if namespace is not None and "*" not in spaces and namespace not in spaces:
            raise AuthError(f"the token is not allowed to publish in namespace {namespace!r} "
                            f"(it may publish in: {', '.join(sorted(spaces))})")


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _error(exc: Exception) -> JSONResponse:
    status = next(code for cls, code in _STATUS if isinstance(exc, cls))
    return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=status)


# Where FastAPI found a bad value (the first part of an error's `loc`), as the detail names it.
_WHERE = {"body": "body field", "query": "query parameter", "path": "path parameter",
          "header": "header"}


def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A malformed request (a missing or mistyped JSON field or query parameter, a body that is
    not JSON) in the API's error shape, one line naming each field, instead of FastAPI's list:
    `{"error": "RequestValidationError", "detail": "query parameter 'ref': Field required"}`."""
    problems = []
    for error in exc.errors():
        source, *path = [str(part) for part in error["loc"]]
        if error["type"] == "json_invalid":  # its path is a character offset, not a field
            reason = (error.get("ctx") or {}).get("error", error["msg"])
            problems.append(f"body: not valid JSON ({reason})")
            continue
        where = f"{_WHERE.get(source, source)} '{'.'.join(path)}'" if path else source
        got = "" if error["type"] == "missing" else f" (got {error.get('input')!r:.80})"
        problems.append(f"{where}: {error['msg']}{got}")
    return JSONResponse({"error": type(exc).__name__, "detail": "; ".join(problems)},
                        status_code=422)


class YankRequest(BaseModel):
    """The body of `POST /api/yank`."""

    ref: str
    reason: str = ""


def _dump(record: Any) -> Any:
    return record.model_dump(mode="json")


def create_app(store: LocalStore, tokens: Tokens, *, web: bool = True) -> FastAPI:
    """The registry app over `store`."""
    app = FastAPI(title="Corral registry", docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.store, app.state.tokens = store, tokens
    # Uploads cut short by a stopped server (even one left a zombie) are gone before the first
    # request; a live writer's file is locked and stays (see `LocalStore.temp_file`).
    if removed := store.recover():
        log.warning("removed %d unfinished upload(s) left by a stopped server", removed)
    app.add_exception_handler(CorralError, lambda request, exc: _error(exc))
    app.add_exception_handler(RequestValidationError, _invalid_request)
    max_upload = store.limits.max_total_bytes

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "store": store.location}

    @app.put("/api/releases")
    async def publish(request: Request) -> JSONResponse:
        token = _bearer(request)
        tokens.check(token)  # refuse before reading a byte of an unauthorised upload
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_upload:
            return _too_large(max_upload)
        with store.temp_file() as (tmp, fh):  # locked until committed or refused
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_upload:
                    return _too_large(max_upload)
                await asyncio.to_thread(fh.write, chunk)
            await asyncio.to_thread(fh.flush)
            result = await asyncio.to_thread(
                store.add_temp, tmp, check_namespace=lambda ns: tokens.check(token, ns))
        return JSONResponse(_dump(result), status_code=201 if result.created else 200)

    @app.get("/api/releases")
    def releases(pattern: str | None = None, include_yanked: bool = True) -> list[Any]:
        return [_dump(r) for r in store.releases(pattern, include_yanked=include_yanked)]

    @app.get("/api/releases/{sha}")
    def release(sha: str) -> Any:
        return _dump(store.get(sha))

    @app.get("/api/releases/{sha}/archive")
    def archive(sha: str) -> FileResponse:
        record = store.get(sha)
        return FileResponse(store.archive(record.sha256), media_type="application/gzip",
                            filename=f"{record.id.replace('/', '__')}-{record.version}.tar.gz",
                            headers={"X-Corral-Sha256": record.sha256})

    @app.get("/api/resolve")
    def resolve(ref: str) -> Any:
        return _dump(store.resolve(ref))

    @app.get("/api/search")
    def search(q: str = "") -> list[Any]:
        return [_dump(r) for r in store.search(q)]

    @app.post("/api/yank")
    def yank(request: Request, body: YankRequest) -> Any:
        ReleaseRef.exact(body.ref)  # a bare id is refused before anything is resolved
        record = store.resolve(body.ref, include_yanked=True)  # yanked: "already yanked", 400
        tokens.check(_bearer(request), record.manifest.namespace)
        return _dump(store.yank(f"sha256:{record.sha256}", reason=body.reason))

    @app.post("/api/profiles")
    def record_profile(request: Request, profile: Profile) -> Any:
        tokens.check(_bearer(request), profile.env_id.partition("/")[0])
        return _dump(store.record_profile(profile))

    @app.get("/api/profiles/{namespace}/{name}")
    def profile(namespace: str, name: str, agent: str | None = None) -> Any:
        store.check_env(f"{namespace}/{name}")  # an unknown env is a 404, not an empty profile
        return _dump(store.profile(f"{namespace}/{name}", agent))

    @app.get("/api/profiles/{namespace}/{name}/agents")
    def profile_agents(namespace: str, name: str) -> list[str]:
        store.check_env(f"{namespace}/{name}")
        return store.profile_agents(f"{namespace}/{name}")

    @app.get("/api/cards/{namespace}/{name}")
    def card(namespace: str, name: str, version: str | None = None) -> Any:
        from .curation import dataset_card

        ref = f"{namespace}/{name}" + (f"@{version}" if version else "")
        return dataset_card(store, ref)

    if web:
        from .web import mount

        mount(app, store)
    return app


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse({"error": "LimitExceeded",
                         "detail": f"upload is over the {limit:,}-byte limit of this registry"},
                        status_code=413)


def serve(home: str | Path | None, *, host: str = "127.0.0.1", port: int = 8080,
          tokens: Tokens | None = None) -> None:
    """Run the registry server (blocking) over the store at `home`."""
    import uvicorn

    app = create_app(LocalStore(home), tokens or Tokens())
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
