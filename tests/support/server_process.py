"""What every test server shares (``servers.py``: nginx, moto's S3, the fault proxy; ``cloud_servers.py``:
fake-gcs-server, Azurite): the loopback host, waiting until a port listens, stopping a process, one context
manager that runs a server process on a free port until the block ends, and ``ObjectStore``: a running
object store's endpoint, its fsspec filesystem and an upload of a directory into a bucket."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tests.support.helpers import free_port

HOST = "127.0.0.1"


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    """Block until something listens on ``HOST:port`` (or raise)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before listening on port {port}")
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout} s")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Stop a server process: ``sig``, then a kill if it has not exited after 10 s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def serving(argv: Callable[[int], list[str]], timeout: float, stop_signal: int = signal.SIGTERM,
            why: Callable[[subprocess.Popen], str] | None = None, port: int | None = None,
            **popen: Any) -> Iterator[tuple[int, subprocess.Popen]]:
    """Run ``argv(port)`` on ``port`` (default: a free one) until the block ends, once it listens: yields
    (port, process). why(proc): what a process that failed to listen said (its stderr), added to the error."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    popen.setdefault("stderr", subprocess.DEVNULL)
    port = free_port() if port is None else port
    proc = subprocess.Popen(argv(port), **popen)
    try:
        try:
            wait_port(port, proc, timeout=timeout)
        except RuntimeError as exc:
            if why is None:
                raise
            raise RuntimeError(f"{exc}\n{why(proc)}") from None
        yield port, proc
    finally:
        stop(proc, stop_signal)


@dataclass
class ObjectStore:
    """A running object-store server: ``scheme://bucket/key`` URLs, reached through fsspec."""

    port: int
    proc: subprocess.Popen = field(repr=False)
    scheme: ClassVar[str] = ""

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def storage_options(self, endpoint: str | None = None) -> dict:
        """fsspec options for this server (or for a proxy in front of it)."""
        raise NotImplementedError

    def fs(self) -> Any:
        """A fresh fsspec filesystem on this server."""
        import fsspec

        return fsspec.filesystem(self.scheme, **self.storage_options(), skip_instance_cache=True)

    def upload_dir(self, bucket: str, directory: str, prefix: str = "", suffixes=(".tar",)) -> list[str]:
        """Create ``bucket`` and upload the files of ``directory`` ending in ``suffixes``; returns their URLs,
        sorted."""
        fs = self.fs()
        with contextlib.suppress(FileExistsError):
            fs.mkdir(bucket)
        urls = []
        for name in sorted(os.listdir(directory)):
            if name.endswith(tuple(suffixes)):
                fs.put_file(os.path.join(directory, name), f"{bucket}/{prefix}{name}")
                urls.append(f"{self.scheme}://{bucket}/{prefix}{name}")
        return urls
