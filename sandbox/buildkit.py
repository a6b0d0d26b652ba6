"""Image builds that take the host's package-index configuration and CA bundle as build
secrets: BuildKit through the Engine API (`POST /build?version=2`), with the secrets served to
the daemon from this process over a BuildKit session (`POST /session`, gRPC over HTTP/2), so
no `docker buildx` binary is needed and nothing of them is written into a layer.

    tag = build_with_host_trust(dockerfile, context, tag, labels={...})

Every `RUN` of the Dockerfile gets two secret mounts (the Dockerfile text is rewritten for the
build only; the recipe's content hash, and so the tag, is the unchanged file's):

- `/run/secrets/corral-ca.crt`: the host's CA bundle (`HostTrust.ca_file`),
- `/etc/xdg/pip/pip.conf`: a pip configuration with `cert` set to that file and the host's
  http(s) `index-url`, `extra-index-url` and `trusted-host` (pip reads it before the image's
  own `/etc/pip.conf`, which wins where both say something).

Both are mounted read-only for the one `RUN` (mode 0444, so a non-root `USER` can read them)
and are not in the image or its history; BuildKit 0.8 (Docker 20.10) may leave their empty
mount points. Other tools are told where the CA file is by the variables they read
(`CA_VARIABLES`: `SSL_CERT_FILE` for OpenSSL and Python, `REQUESTS_CA_BUNDLE`,
`CURL_CA_BUNDLE`, `PIP_CERT`, `NODE_EXTRA_CA_CERTS`, `GIT_SSL_CAINFO`), declared as build args
after each `FROM`: their value is the path alone, which the image history shows, and they do
not become the image's environment. A stage's own `ENV` of one of them wins. The system bundle
is not replaced, so installing `ca-certificates` keeps working.
"""

from __future__ import annotations

import contextlib
import base64
import configparser
import json
import logging
import os
import re
import secrets as _secrets
import socket
import tarfile
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.client import HTTPConnection
from pathlib import Path
from typing import IO, Any, Callable, Mapping

from ..errors import ImageBuildError, SandboxError

__all__ = ["CA_TARGET", "CA_VARIABLES", "HostTrust", "PIP_TARGET", "SECRET_METHODS",
           "build_with_host_trust", "host_trust", "rewrite_runs"]

log = logging.getLogger(__name__)

CA_TARGET = "/run/secrets/corral-ca.crt"
PIP_TARGET = "/etc/xdg/pip/pip.conf"
SECRET_METHODS = ("/moby.buildkit.secrets.v1.Secrets/GetSecret", "/grpc.health.v1.Health/Check")
_MOUNTS = (f"--mount=type=secret,id=corral-ca,target={CA_TARGET},mode=0444,required=false "
           f"--mount=type=secret,id=corral-pip,target={PIP_TARGET},mode=0444,required=false ")
# what tools read for their CA file; each a build arg naming the secret's path (not its content)
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT",
                "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")
_CA_CANDIDATES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                  "/etc/ssl/cert.pem")


@dataclass
class HostTrust:
    """What a build takes from the host: its CA bundle and its pip index settings."""

    ca_file: Path | None = None
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    trusted_hosts: list[str] = field(default_factory=list)

    def pip_conf(self) -> str:
        """The pip configuration the build's `RUN`s read."""
        lines = ["[global]"]
        if self.ca_file is not None:
            lines.append(f"cert = {CA_TARGET}")
        if self.index_url:
            lines.append(f"index-url = {self.index_url}")
        if self.extra_index_urls:
            lines.append(f"extra-index-url = {' '.join(self.extra_index_urls)}")
        if self.trusted_hosts:
            lines.append(f"trusted-host = {' '.join(self.trusted_hosts)}")
        return "\n".join(lines) + "\n"

    def secrets(self) -> dict[str, bytes]:
        out = {"corral-pip": self.pip_conf().encode()}
        if self.ca_file is not None:
            out["corral-ca"] = self.ca_file.read_bytes()
        return out


def _pip_files(environ: Mapping[str, str]) -> list[Path]:
    """pip's configuration files, lowest precedence first, as pip reads them."""
    home = Path(environ.get("HOME", "~")).expanduser()
    files = [Path(d) / "pip" / "pip.conf"
             for d in reversed(environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")) if d]
    files += [Path("/etc/pip.conf"), home / ".pip" / "pip.conf",
              Path(environ.get("XDG_CONFIG_HOME", home / ".config")) / "pip" / "pip.conf"]
    if environ.get("PIP_CONFIG_FILE"):
        files.append(Path(environ["PIP_CONFIG_FILE"]))
    return files


def _remote(urls: str) -> list[str]:
    """The http(s) URLs of a pip setting (file:// and folders are the host's own)."""
    return [u for u in urls.split() if urllib.parse.urlsplit(u).scheme in ("http", "https")]


def host_trust(environ: Mapping[str, str] | None = None) -> HostTrust:
    """The host's CA bundle (pip's `cert`, else `PIP_CERT`, `SSL_CERT_FILE`,
    `REQUESTS_CA_BUNDLE`, else the system bundle) and pip index settings (its config files, then
    `PIP_INDEX_URL`, `PIP_EXTRA_INDEX_URL`, `PIP_TRUSTED_HOST`)."""
    environ = os.environ if environ is None else environ
    settings: dict[str, str] = {}
    for path in _pip_files(environ):
        parser = configparser.ConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError) as exc:
            log.warning("%s: not read (%s)", path, exc)
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                settings.update(parser[section])
    for key in ("cert", "index-url", "extra-index-url", "trusted-host"):
        value = environ.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            settings[key] = value
    ca = next((Path(c) for c in (settings.get("cert"), environ.get("SSL_CERT_FILE"),
                                 environ.get("REQUESTS_CA_BUNDLE"), *_CA_CANDIDATES)
               if c and Path(c).is_file()), None)
    index = _remote(settings.get("index-url", ""))
    return HostTrust(ca, index[0] if index else None, _remote(settings.get("extra-index-url", "")),
                     settings.get("trusted-host", "").split())


def rewrite_runs(text: str, ca_args: bool = False) -> str:
    """The Dockerfile with both secret mounts added to every `RUN` instruction (line
    continuations, comments and the `escape` parser directive are respected); with `ca_args`,
    each stage also declares the `CA_VARIABLES` as build args (`ARG`), right after its
    `FROM`."""
    escape = "\\"
    match = re.match(r"(?:\s*#\s*[a-z]+\s*=.*\n)*?\s*#\s*escape\s*=\s*(\S)", text, re.I)
    if match:
        escape = match[1]
    out, continued, stage = [], False, False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if not continued and re.match(r"RUN(\s|$)", stripped, re.I):
            indent = line[:len(line) - len(line.lstrip())]
            line = indent + stripped[:3] + " " + _MOUNTS + line.lstrip()[3:].lstrip(" \t")
        elif continued and stripped.startswith("#"):
            out.append(line)
            continue
        stage = stage or (not continued and bool(re.match(r"FROM\s", stripped, re.I)))
        continued = stripped.endswith(escape) if stripped else continued
        out.append(line)
        if stage and not continued and ca_args:  # the FROM statement ended on this line
            out.append(("" if line.endswith("\n") else "\n")
                       + "".join(f"ARG {name}\n" for name in CA_VARIABLES))
            stage = False
    return "".join(out)


# --- the BuildKit session: a gRPC server for the daemon on a hijacked connection -------------
def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(data: bytes) -> list[tuple[int, Any]]:
    """A protobuf message's (field number, value) pairs: ints for varints, bytes for
    length-delimited fields (the only wire types BuildKit's messages here use besides fixed)."""
    out, i = [], 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire}")
        out.append((number, value))
    return out


def _bytes_field(number: int, value: bytes) -> bytes:
    size, prefix = len(value), bytearray([number << 3 | 2])
    while True:
        byte, size = size & 0x7F, size >> 7
        prefix.append(byte | (0x80 if size else 0))
        if not size:
            return bytes(prefix) + value


class _Session:
    """The gRPC server BuildKit calls back: the secrets by id, and its health checks."""

    def __init__(self, socket_path: str, secrets: Mapping[str, bytes]) -> None:
        self.id = _secrets.token_hex(16)
        self.secrets = dict(secrets)
        self.served: list[str] = []  # the secret ids the daemon asked for
        self._pending: dict[int, bytes] = {}  # stream -> answer bytes the window held back
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(30)
        self._sock.connect(socket_path)
        methods = "".join(f"X-Docker-Expose-Session-Grpc-Method: {m}\r\n" for m in SECRET_METHODS)
        self._sock.sendall((
            "POST /session HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
            f"X-Docker-Expose-Session-Uuid: {self.id}\r\n"
            "X-Docker-Expose-Session-Name: corral\r\n"
            f"X-Docker-Expose-Session-Sharedkey: {self.id}\r\n{methods}\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise SandboxError("the Docker daemon closed the BuildKit session at once")
            head += chunk
        head, _, self._early = head.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise SandboxError(f"the Docker daemon refused a BuildKit session: "
                               f"{head.splitlines()[0].decode(errors='replace')}")
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._serve, name="corral-buildkit-session",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import h2.config
        import h2.connection
        import h2.events

        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        self._sock.sendall(conn.data_to_send())
        streams: dict[int, dict[str, Any]] = {}
        data = self._early
        try:
            while True:
                if not data:
                    data = self._sock.recv(65536)
                    if not data:
                        return
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        streams[event.stream_id] = {"headers": dict(event.headers), "body": b""}
                    elif isinstance(event, h2.events.DataReceived):
                        streams[event.stream_id]["body"] += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length,
                                                       event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        self._answer(conn, event.stream_id, streams.pop(event.stream_id))
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return
                data = b""
                self._flush(conn)
                self._sock.sendall(conn.data_to_send())
        except OSError:  # the session's socket was closed: the build is over
            return

    def _answer(self, conn: Any, stream_id: int, request: dict[str, Any]) -> None:
        path, body = request["headers"].get(":path", ""), request["body"][5:]
        status, message = 0, b""
        if path == "/grpc.health.v1.Health/Check":
            message = b"\x08\x01"  # HealthCheckResponse{status: SERVING}
        elif path == "/moby.buildkit.secrets.v1.Secrets/GetSecret":
            wanted = next((v.decode() for n, v in _fields(body) if n == 1), "")
            if wanted in self.secrets:
                self.served.append(wanted)
                message = _bytes_field(1, self.secrets[wanted])  # GetSecretResponse{data}
            else:
                status = 5  # NOT_FOUND
        else:
            status = 12  # UNIMPLEMENTED
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        if status:
            conn.send_headers(stream_id, headers + [("grpc-status", str(status))],
                              end_stream=True)
            return
        conn.send_headers(stream_id, headers)
        self._pending[stream_id] = b"\x00" + len(message).to_bytes(4, "big") + message

    def _flush(self, conn: Any) -> None:
        """Send what the peer's flow-control windows allow of the answers pending; an answer
        sent in full gets its trailers."""
        for stream_id, data in list(self._pending.items()):
            while data:
                size = min(len(data), conn.local_flow_control_window(stream_id),
                           conn.max_outbound_frame_size)
                if size <= 0:
                    break
                conn.send_data(stream_id, data[:size])
                data = data[size:]
            if data:
                self._pending[stream_id] = data
            else:
                del self._pending[stream_id]
                conn.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)


class _UnixHTTP(HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("docker", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _trace(aux: str) -> tuple[list[tuple[str, str]], list[str]]:
    """A `moby.buildkit.trace` record: (vertex name, its error) pairs and log lines."""
    vertexes, logs = [], []
    for number, value in _fields(base64.b64decode(aux)):
        if number == 1:  # Vertex: name = 3, error = 7
            parts = dict(_fields(value))
            vertexes.append((parts.get(3, b"").decode(errors="replace"),
                             parts.get(7, b"").decode(errors="replace")))
        elif number == 3:  # VertexLog: msg = 4
            logs.append(dict(_fields(value)).get(4, b"").decode(errors="replace"))
    return vertexes, logs


def _gnu_tar(source: IO[bytes], first: str) -> IO[bytes]:
    """docker-py's context tar again in GNU format with `first` leading: BuildKit tells an
    uploaded context from a Dockerfile by reading the first tar header alone, and Python's
    PAX headers (float mtimes) make that read fail, so the tar was taken for a Dockerfile."""
    out = tempfile.TemporaryFile()
    with tarfile.open(fileobj=source) as tin, \
            tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tout:
        members = tin.getmembers()
        for member in sorted(members, key=lambda m: m.name != first):
            member.mtime = int(member.mtime)
            tout.addfile(member, tin.extractfile(member) if member.isfile() else None)
    source.close()
    out.seek(0)
    return out


def build_with_host_trust(dockerfile: Path, context: Path, tag: str, *,
                          labels: Mapping[str, str] | None = None,
                          trust: HostTrust | None = None, socket_path: str | None = None,
                          timeout: float = 3600.0,
                          on_line: Callable[[str], None] | None = None) -> list[str]:
    """Build `dockerfile` (context folder `context`) as `tag` with BuildKit, every `RUN` given
    the host's trust as secrets (module docstring). Returns the secret ids the build read.
    Raises ImageBuildError naming the file and the failing step. Blocks."""
    import docker.utils

    try:
        import h2  # noqa: F401  (the session's HTTP/2)
    except ImportError:
        raise ImageBuildError(f"{dockerfile}: builds with the host's trust need the h2 package "
                              "(pip install 'corral[buildkit]')") from None
    trust = trust or host_trust()
    if socket_path is None:
        url = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        if not url.startswith("unix://"):
            raise ImageBuildError(f"{dockerfile}: builds with the host's trust need the local "
                                  f"Docker daemon's socket, not DOCKER_HOST={url}")
        socket_path = url[len("unix://"):]
    exclude = None
    ignore = context / ".dockerignore"
    if ignore.is_file():
        exclude = [p.strip() for p in ignore.read_text().splitlines()
                   if p.strip() and not p.strip().startswith("#")]
    name = f".corral-{_secrets.token_hex(4)}.Dockerfile"  # docker-py's way: ignored by COPY
    ca = trust.ca_file is not None
    archive = _gnu_tar(docker.utils.tar(str(context), exclude=exclude, dockerfile=(
        name, rewrite_runs(dockerfile.read_text(), ca_args=ca))), first=name)
    query = urllib.parse.urlencode({
        "version": "2", "t": tag, "dockerfile": name, "rm": "1", "forcerm": "1",
        "labels": json.dumps(dict(labels or {})),
        "buildargs": json.dumps({v: CA_TARGET for v in CA_VARIABLES} if ca else {})})
    session = _Session(socket_path, trust.secrets())
    step, error = "", ""
    try:
        http = _UnixHTTP(socket_path, timeout)
        http.request("POST", f"/v1.41/build?{query}&session={session.id}", body=archive,
                     headers={"Content-Type": "application/x-tar"})
        response = http.getresponse()
        if response.status != 200:
            raise ImageBuildError(f"{dockerfile}: build refused: "
                                  f"{response.read().decode(errors='replace').strip()}")
        for raw in response:
            chunk = json.loads(raw) if raw.strip() else {}
            if chunk.get("id") == "moby.buildkit.trace":
                vertexes, logs = _trace(chunk["aux"])
                step = next((vertex for vertex, failed in vertexes if failed), step)
                for line in logs:
                    if on_line:
                        on_line(line.rstrip("\n"))
            if "error" in chunk:
                error = chunk["error"].strip()
        http.close()
    finally:
        session.close()
        archive.close()
    if error:
        where = f" at {step}" if step else ""
        raise ImageBuildError(f"{dockerfile}: build failed{where}: {error}")
    return session.served
