"""Task sites: each episode's pages, served from one local HTTP server per process.

An env describes its site for one task as a mapping `path -> page`, where a page is HTML text,
bytes, a `Response`, or a function `Request -> Response | str` (dynamic pages: search results),
each served with the Content-Type of its path's extension (HTML where it has none), or a
`StaticFiles` folder mounted at that path (a package's pages, scripts and stylesheets).
`TaskServer.open(pages)` gives the episode a `SiteSession`. Every episode's site lives at the
same origin, `http://127.0.0.1:<port>`; the server tells episodes apart by the `X-Corral-Site`
header that the episode's browser context sends with every request (its token). Episodes stay
apart because each has its own browser context (cookies, storage, cache), and one shared origin
lets the pool keep warm pages already on it, so a reset is a same-site navigation with no new
renderer process. A pooled context sends its token from the moment it is made (the session is
opened with that token at reset), and its requests to this origin skip Playwright's routing.
Every POST (and every request to a path the site does not define) is recorded in
`session.submissions`, which rewards read after the episode.

The same `TaskServer.handle` answers both real HTTP requests (host mode) and requests fulfilled
through Playwright routing (containerized mode, where the browser has no network at all).
"""

from __future__ import annotations

import json
import logging
import mimetypes
import secrets
import threading
from dataclasses import dataclass, field
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Mapping, Union
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["BLANK_PATH", "HOST", "Page", "Request", "Response", "SITE_HEADER", "SUBMITTED",
           "SiteSession", "StaticFiles", "TaskServer", "content_type", "html_page", "task_server"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
SITE_HEADER = "X-Corral-Site"
BLANK_PATH = "/__corral/blank"  # served to any context: where warm pages wait


@dataclass(slots=True)
class Request:
    """One request to a task site."""

    method: str
    path: str
    query: dict[str, list[str]]
    form: dict[str, list[str]]
    headers: dict[str, str]

    def arg(self, name: str, default: str = "") -> str:
        """The first value of `name` in the form body, else in the query string."""
        values = self.form.get(name) or self.query.get(name)
        return values[0] if values else default


@dataclass(slots=True)
class Response:
    """What a task site answers."""

    body: bytes | str = b""
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    def payload(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else self.body


def content_type(path: str, default: str = "text/html; charset=utf-8") -> str:
    """The Content-Type of `path` from its extension (text in UTF-8); `default` when the
    extension says nothing (`/`, `/cart`)."""
    guessed, _ = mimetypes.guess_type(path)
    if guessed is None:
        return default
    text = guessed.startswith("text/") or guessed in ("application/javascript", "application/json",
                                                      "image/svg+xml")
    return f"{guessed}; charset=utf-8" if text else guessed


class StaticFiles:
    """A folder of static files, served under the path it is mounted at: `{"/": StaticFiles(d)}`
    serves `d/a/b.css` at `/a/b.css`, `{"/assets": StaticFiles(d)}` at `/assets/a/b.css` (a
    folder's `index.html` at the folder's path), each with the Content-Type of its extension.
    Pages defined beside it take precedence; nothing outside the folder is served. Files are
    read once and kept in memory (up to `max_bytes` in all), so many episodes share one read."""

    def __init__(self, root: str | Path, *, max_bytes: int = 64 << 20) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"StaticFiles: {root} is not a folder")
        self.max_bytes = max_bytes
        self._cache: dict[str, Response | None] = {}
        self._size = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StaticFiles({str(self.root)!r})"

    def get(self, relative: str) -> Response | None:
        """The file at `relative` (the URL path below the mount point) as a Response, or None."""
        with self._lock:
            if relative in self._cache:
                return self._cache[relative]
        response = self._read(relative)
        size = len(response.payload()) if response is not None else 0
        with self._lock:
            if self._size + size <= self.max_bytes:
                self._cache[relative] = response
                self._size += size
        return response

    def _read(self, relative: str) -> Response | None:
        target = (self.root / unquote(relative).lstrip("/")).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(self.root) or not target.is_file():
            return None
        return Response(target.read_bytes(), content_type=content_type(target.name))


Page = Union[str, bytes, Response, StaticFiles, Callable[[Request], Union[Response, str]]]


@dataclass
class SiteSession:
    """One episode's site: its origin, pages and what was submitted to it."""

    token: str
    origin: str
    pages: dict[str, Page]
    submissions: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    # `StaticFiles` folders by mount point (ending in "/"), longest first
    mounts: list[tuple[str, StaticFiles]] = field(default_factory=list)

    def url(self, path: str = "/") -> str:
        """Absolute URL of `path` on this site."""
        return self.origin + (path if path.startswith("/") else "/" + path)

    def last(self, path: str | None = None) -> dict[str, Any] | None:
        """The latest submission (to `path` when given), or None."""
        for sub in reversed(self.submissions):
            if path is None or sub["path"] == path:
                return sub
        return None


def html_page(title: str, body: str, script: str = "", style: str = "") -> str:
    """A small complete HTML document (task pages share this scaffold)."""
    css = ("body{font-family:sans-serif;margin:16px;max-width:760px}"
           "button{margin:2px}label{margin-right:8px}" + style)
    js = f"<script>{script}</script>" if script else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{css}</style></head><body>{body}{js}</body></html>")


SUBMITTED = html_page("Submitted", "<h1>Submitted</h1><p>Your submission was received.</p>")


class TaskServer:
    """A threaded HTTP server on 127.0.0.1 serving every open `SiteSession` by Host name."""

    def __init__(self) -> None:
        self._sessions: dict[str, SiteSession] = {}
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: one connection serves a whole episode

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                token = self.headers.get(SITE_HEADER) or ""
                resp = server.handle(self.command, token, self.path, dict(self.headers), body)
                data = resp.payload()
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.content_type)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                for key, value in resp.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        self.wfile.write(data)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # the page navigated away or its context closed mid-response

            do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("site %s", format % args)

        self._httpd = ThreadingHTTPServer((HOST, 0), Handler)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self.origin = f"http://{HOST}:{self.port}"
        self.blank_url = self.origin + BLANK_PATH
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="corral-site",
                                        daemon=True)
        self._thread.start()
        log.info("task site server on http://%s:%d", HOST, self.port)

    # --- sessions -------------------------------------------------------------------------
    def open(self, pages: Mapping[str, Page], token: str | None = None) -> SiteSession:
        """Serve `pages` to one episode (the context that sends this session's token: `token`,
        the one a pooled context already sends, or a new one)."""
        token = token or secrets.token_hex(8)
        mounts = sorted(((p.rstrip("/") + "/" if p.rstrip("/") else "/", page)
                         for p, page in pages.items() if isinstance(page, StaticFiles)),
                        key=lambda m: -len(m[0]))
        session = SiteSession(token, self.origin,
                              {_norm(p): page for p, page in pages.items()
                               if not isinstance(page, StaticFiles)}, mounts=mounts)
        with self._lock:
            self._sessions[token] = session
        return session

    def close(self, session: SiteSession) -> None:
        """Stop serving a session (its submissions stay readable on the object)."""
        with self._lock:
            self._sessions.pop(session.token, None)

    # --- requests -------------------------------------------------------------------------
    def handle(self, method: str, token: str, target: str, headers: Mapping[str, str],
               body: bytes) -> Response:
        """Answer one request of the session with `token` (from the HTTP server or from
        browser routing)."""
        parts = urlsplit(target)
        if parts.path == BLANK_PATH:
            return Response(html_page("", ""))
        session = self._sessions.get(token)
        if session is None:
            return Response(html_page("Not found", "<h1>No such site</h1>"), 404)
        path = _norm(parts.path)
        request = Request(method.upper(), path, parse_qs(parts.query),
                          _parse_body(body, headers), {k.lower(): v for k, v in headers.items()})
        page: Page | None = session.pages.get(path)
        if page is None and request.method in ("GET", "HEAD"):
            page = _mounted(session, parts.path)
        if request.method == "POST" or page is None and path != "/favicon.ico":
            session.submissions.append({"method": request.method, "path": path,
                                        "form": {k: v[0] if len(v) == 1 else v
                                                 for k, v in {**request.query,
                                                              **request.form}.items()}})
        if page is None:
            if request.method == "POST" or request.query:
                return Response(SUBMITTED)
            return Response(html_page("Not found", f"<h1>Not found: {escape(path)}</h1>"), 404)
        return _render(page, request)


def _norm(path: str) -> str:
    path = "/" + path.lstrip("/")
    return "/" if path in ("/", "/index.html") else path


def _parse_body(body: bytes, headers: Mapping[str, str]) -> dict[str, list[str]]:
    if not body:
        return {}
    ctype = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    text = body.decode("utf-8", "replace")
    if "json" in ctype:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return {"_raw": [text]}
        if isinstance(data, dict):
            return {str(k): [v if isinstance(v, str) else json.dumps(v)] for k, v in data.items()}
        return {"_json": [text]}
    return parse_qs(text, keep_blank_values=True)


def _mounted(session: SiteSession, path: str) -> Response | None:
    """The file a `StaticFiles` mount of the session serves at `path`, or None."""
    path = "/" + path.lstrip("/")
    for prefix, files in session.mounts:
        if path.startswith(prefix) or path + "/" == prefix:
            found = files.get(path[len(prefix):])
            if found is not None:
                return found
    return None


def _render(page: Page, request: Request) -> Response:
    if callable(page) and not isinstance(page, StaticFiles):
        page = page(request)
    if isinstance(page, Response):
        return page
    return Response(page, content_type=content_type(request.path))  # type: ignore[arg-type]


_servers: dict[int, TaskServer] = {}
_servers_lock = threading.Lock()


def task_server() -> TaskServer:
    """The process's task-site server, started on first use."""
    with _servers_lock:
        server = _servers.get(0)
        if server is None:
            server = _servers[0] = TaskServer()
        return server
