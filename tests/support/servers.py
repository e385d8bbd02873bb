"""Real servers on 127.0.0.1 for the remote-storage tests.

- ``nginx_server(root, ranges=True)``: Debian's nginx serving a directory
  over HTTP/1.1 with Range requests (``ranges=False``: ``max_ranges 0``, so
  every GET is answered 200 with the whole file) and ETags, as a foreground process with a generated
  config; its access log records every request with the bytes it sent.
- ``s3_server()``: moto's S3 API server in a subprocess, spoken to over HTTP
  by boto3 and s3fs.
- ``FaultProxy``: a small TCP proxy (threads and sockets) in front of either,
  HTTP-aware enough to add latency per request, answer 503 to chosen
  requests, reset a connection after N response bytes, never answer (or go
  silent after N response bytes), and count requests and bytes.

Each is a context manager; tests skip (``pytest.skip``) when nginx or moto is
not installed. Nothing here mocks storage: clients speak real HTTP to real
servers. What every server shares (the host, a listening port, stopping, a
process run until the block ends, an object store's upload) is
``server_process.py``, also under the GCS and Azure servers of
``cloud_servers.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import pytest

from tests.support.helpers import free_port
from tests.support.server_process import HOST, ObjectStore, serving

S3_KEY = S3_SECRET = "testing"  # moto accepts any credentials


# ---------------------------------------------------------------- nginx


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)


@dataclass
class LogEntry:
    """One access-log line: method, path, status, bytes sent (headers and
    body), body bytes, Range header."""

    method: str
    path: str
    status: int
    bytes_sent: int
    body_bytes: int
    range: str


@dataclass
class Nginx:
    root: str
    port: int
    log_path: str
    proc: subprocess.Popen = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def log(self, expect: int | None = None, timeout: float = 10.0) -> list[LogEntry]:
        """Requests served so far. nginx writes a request's line after it has
        sent the response, so a client can see the response before its line
        exists: wait until the log holds ``expect`` lines (or, without
        ``expect``, until it stops growing for 0.1 s), at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        last, still = -1, 0
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                data = f.read()
            lines = data.count(b"\n")
            if expect is not None and lines >= expect:
                break
            still = still + 1 if lines == last else 0
            if expect is None and still >= 2:
                break
            last = lines
            time.sleep(0.05)
        out = []
        with open(self.log_path) as f:
            for line in f:
                method, path, status, sent, body, rng = line.rstrip("\n").split("\t")
                out.append(LogEntry(method, path, int(status), int(sent), int(body), "" if rng == "-" else rng))
        return out

    def clear_log(self) -> None:
        open(self.log_path, "w").close()  # nginx appends (O_APPEND), so truncating is safe


_NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
{user}
events {{ worker_connections 512; }}
http {{
    log_format sb '$request_method\\t$uri\\t$status\\t$bytes_sent\\t$body_bytes_sent\\t$http_range';
    access_log {prefix}/access.log sb;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 60;
    keepalive_requests 100000;
    server {{
        listen {host}:{port};
        root {root};
        {max_ranges}
        location / {{ {auth} autoindex on; }}
    }}
}}
"""


def _bearer_rule(bearer: str | None) -> str:
    return f'if ($http_authorization != "Bearer {bearer}") {{ return 401; }}' if bearer else ""


@contextlib.contextmanager
def nginx_server(root, ranges: bool = True, bearer: str | None = None):
    """nginx serving directory ``root`` on a free 127.0.0.1 port until the
    block ends; ``ranges=False``: a server that ignores Range headers;
    ``bearer``: every request without ``Authorization: Bearer <bearer>`` is
    answered 401 (a private or gated Hub repo)."""
    binary = nginx_binary()
    if binary is None:
        pytest.skip("nginx is not installed (apt-get install -y --no-install-recommends nginx-light)")
    prefix = tempfile.mkdtemp(prefix="sb-nginx-")
    port = free_port()
    # As root, nginx would drop its workers to 'nobody', who cannot read pytest's 0700 temp dirs.
    user = "user root;" if os.geteuid() == 0 else ""
    conf = os.path.join(prefix, "nginx.conf")
    with open(conf, "w") as f:
        f.write(_NGINX_CONF.format(prefix=prefix, user=user, host=HOST, port=port, root=os.path.abspath(root),
                             max_ranges="" if ranges else "max_ranges 0;",
                             auth=_bearer_rule(bearer)))
    open(os.path.join(prefix, "access.log"), "w").close()
    # -e: the error log before the config is read (else /var/log/nginx, maybe unwritable).
    try:
        with serving(lambda _port: [binary, "-p", prefix, "-c", conf, "-e", os.path.join(prefix, "error.log")],
                     timeout=15, stop_signal=signal.SIGQUIT,  # graceful: workers finish their requests
                     why=lambda p: "nginx did not start: " + (p.stderr.read().decode(errors="replace")
                                                              if p.poll() is not None else ""),
                     stderr=subprocess.PIPE, port=port) as (_, proc):
            yield Nginx(os.path.abspath(root), port, os.path.join(prefix, "access.log"), proc)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


# ---------------------------------------------------------------- S3 (moto)


@dataclass
class S3(ObjectStore):
    scheme = "s3"

    def storage_options(self, endpoint: str | None = None) -> dict:
        """s3fs options for this server (or for a proxy in front of it)."""
        return {"key": S3_KEY, "secret": S3_SECRET,
                "client_kwargs": {"endpoint_url": endpoint or self.endpoint, "region_name": "us-east-1"}}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_KEY,
                            aws_secret_access_key=S3_SECRET, region_name="us-east-1")

    def upload_dir(self, bucket: str, directory: str, prefix: str = "", suffixes=(".tar",)) -> list[str]:
        """Create ``bucket`` and upload the files of ``directory`` ending in
        ``suffixes``; returns their ``s3://`` URLs, sorted."""
        c = self.client()
        with contextlib.suppress(c.exceptions.BucketAlreadyOwnedByYou):
            c.create_bucket(Bucket=bucket)
        urls = []
        for name in sorted(os.listdir(directory)):
            if name.endswith(tuple(suffixes)):
                key = f"{prefix}{name}"
                c.upload_file(os.path.join(directory, name), bucket, key)
                urls.append(f"s3://{bucket}/{key}")
        return urls


@contextlib.contextmanager
def s3_server():
    """moto's S3 server in a subprocess on a free 127.0.0.1 port."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        pytest.skip("moto's server is not installed (pip install 'moto[server]' boto3 s3fs)")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=S3_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET, AWS_DEFAULT_REGION="us-east-1")
    with serving(lambda port: [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)], timeout=60,
                 env=env) as (port, proc):
        yield S3(port, proc)


# ---------------------------------------------------------------- fault proxy


@dataclass
class Request:
    """One request seen by the proxy; ``fault`` is '503', 'reset', 'hang' or ''."""

    method: str
    target: str
    range: str
    fault: str


class _Conn:
    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.down = 0  # response bytes sent to the client on this connection
        self.reset_at: int | None = None
        self.hang_at: int | None = None  # response bytes after which the proxy goes silent
        self.closed = False
        self.gone = threading.Event()  # set on close: a silent side waits on it
        self.lock = threading.Lock()

    def close(self, reset: bool = False) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.gone.set()
        if reset:  # RST instead of FIN: the client sees "connection reset by peer"
            with contextlib.suppress(OSError):
                self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()


class FaultProxy:
    """A TCP proxy on a free 127.0.0.1 port in front of ``HOST:upstream_port``.

    Set these attributes at any time (they apply to requests that arrive
    afterwards); faults apply to requests whose request line contains
    ``match`` (all if None) and count down as they fire:

    - ``latency``: seconds waited before forwarding each request;
    - ``fail_next``: answer the next k requests ``503`` (and close);
    - ``fail_every``: answer every n-th request 503 (0: off);
    - ``reset_next`` / ``reset_after``: reset the connection (TCP RST) after
      ``reset_after`` response bytes, for the next k requests;
    - ``reset_every``: the same for every n-th request (0: off);
    - ``stall``: seconds of silence before such a reset (a read timeout);
    - ``hang_next`` / ``hang_after``: for the next k requests, pass
      ``hang_after`` response bytes (0: the request is never forwarded, so no
      answer at all), then send nothing more, ever, keeping the connection
      open (a server that stopped answering: only the client's timeout ends
      the wait).

    ``requests`` lists what arrived, ``bytes_down`` counts response bytes
    sent to clients (headers included). Stop it with ``close()`` or use it as
    a context manager.
    """

    def __init__(self, upstream_port: int, upstream_host: str = HOST):
        self.upstream = (upstream_host, upstream_port)
        self.latency = 0.0
        self.match: str | None = None
        self.fail_next = self.fail_every = 0
        self.reset_next = self.reset_every = 0
        self.reset_after = 0
        self.stall = 0.0
        self.hang_next = 0
        self.hang_after = 0
        self.requests: list[Request] = []
        self.bytes_down = 0
        self._lock = threading.Lock()
        self._seen = 0  # matching requests so far (for the *_every rules)
        self._conns: set[_Conn] = set()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((HOST, 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._stopping = False
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def reset_stats(self) -> None:
        with self._lock:
            self.requests, self.bytes_down = [], 0

    def faults_fired(self) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.fault)

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        for c in list(self._conns):
            c.close()
        self._thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -------------------------------------------------------- internals

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, upstream)
            self._conns.add(conn)
            threading.Thread(target=self._requests, args=(conn,), daemon=True).start()
            threading.Thread(target=self._responses, args=(conn,), daemon=True).start()

    def _decide(self, line: str) -> str:
        with self._lock:
            if self.match is not None and self.match not in line:
                return ""
            self._seen += 1
            if self.fail_next > 0:
                self.fail_next -= 1
                return "503"
            if self.fail_every and self._seen % self.fail_every == 0:
                return "503"
            if self.reset_next > 0:
                self.reset_next -= 1
                return "reset"
            if self.reset_every and self._seen % self.reset_every == 0:
                return "reset"
            if self.hang_next > 0:
                self.hang_next -= 1
                return "hang"
            return ""

    def _requests(self, conn: _Conn) -> None:
        """Client -> server: parse each request head, apply faults, forward."""
        buf = b""
        raw = False  # after a chunked body we stop parsing and just pass bytes through
        try:
            while True:
                if raw:
                    data = conn.client.recv(65536)
                    if not data:
                        break
                    conn.upstream.sendall(data)
                    continue
                while b"\r\n\r\n" not in buf:
                    data = conn.client.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
                fault = self._decide(lines[0])
                with self._lock:
                    self.requests.append(Request(parts[0], parts[1] if len(parts) > 1 else "",
                                                 headers.get("range", ""), fault))
                if fault == "503":
                    body = b"injected fault\n"
                    conn.client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
                    return
                if fault == "hang" and not self.hang_after:
                    while conn.client.recv(65536):  # swallow the request; answer nothing until the client leaves
                        pass
                    return
                if self.latency:
                    time.sleep(self.latency)
                # No pipelining: the previous response is complete, so conn.down is where this one starts.
                conn.reset_at = conn.down + self.reset_after if fault == "reset" else None
                conn.hang_at = conn.down + self.hang_after if fault == "hang" else None
                conn.upstream.sendall(head + b"\r\n\r\n")
                if "chunked" in headers.get("transfer-encoding", "").lower():
                    conn.upstream.sendall(buf)
                    buf, raw = b"", True
                    continue
                need = int(headers.get("content-length", "0") or 0)
                while len(buf) < need:
                    data = conn.client.recv(65536)
                    if not data:
                        return
                    buf += data
                conn.upstream.sendall(buf[:need])
                buf = buf[need:]
        except OSError:
            pass
        finally:
            conn.close()
            self._conns.discard(conn)

    def _responses(self, conn: _Conn) -> None:
        """Server -> client: count bytes, cut the connection where a reset is armed."""
        try:
            while True:
                data = conn.upstream.recv(65536)
                if not data:
                    break
                at = conn.hang_at
                if at is not None and conn.down + len(data) >= at:
                    part = data[: max(0, at - conn.down)]
                    self._count(conn, len(part))
                    if part:
                        conn.client.sendall(part)
                    conn.gone.wait()  # silent, connection open, until the client or the proxy closes it
                    return
                at = conn.reset_at
                if at is not None and conn.down + len(data) >= at:
                    part = data[: max(0, at - conn.down)]
                    self._count(conn, len(part))
                    if part:
                        conn.client.sendall(part)
                    if self.stall:
                        time.sleep(self.stall)  # a silent server first: the client's read timeout fires
                    conn.close(reset=True)
                    return
                # counted before it is sent: a client that has read the last byte then sees it counted
                self._count(conn, len(data))
                conn.client.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()

    def _count(self, conn: _Conn, n: int) -> None:
        conn.down += n
        with self._lock:
            self.bytes_down += n
