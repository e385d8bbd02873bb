"""The test servers themselves: nginx ranges and logs, moto S3, the fault proxy."""

from __future__ import annotations

import http.client
import os
import time

import pytest

from tests.support.servers import HOST, FaultProxy, nginx_server, s3_server

pytestmark = pytest.mark.slow

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    d = tmp_path_factory.mktemp("site")
    (d / "blob.bin").write_bytes(PAYLOAD)
    return str(d)


def get(port: int, path: str, headers=None, method="GET"):
    c = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        c.request(method, path, headers=headers or {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def test_nginx_ranges_etag_and_log(site):
    with nginx_server(site) as ng:
        status, headers, body = get(ng.port, "/blob.bin")
        assert status == 200 and body == PAYLOAD
        status, headers, body = get(ng.port, "/blob.bin", {"Range": "bytes=1000-1999"})
        assert status == 206 and body == PAYLOAD[1000:2000]
        assert headers["Content-Range"] == f"bytes 1000-1999/{len(PAYLOAD)}"
        status, headers, _ = get(ng.port, "/blob.bin", method="HEAD")
        assert int(headers["Content-Length"]) == len(PAYLOAD) and headers["ETag"]
        assert get(ng.port, "/missing.bin")[0] == 404
        log = ng.log(expect=4)
        assert [(e.method, e.status) for e in log] == [("GET", 200), ("GET", 206), ("HEAD", 200), ("GET", 404)]
        assert log[0].bytes_sent > len(PAYLOAD) and 1000 < log[1].bytes_sent < 2000 + 500
        assert log[1].range == "bytes=1000-1999"
    assert ng.proc.poll() is not None  # stopped with the block


def test_proxy_latency_503_and_reset(site):
    with nginx_server(site) as ng, FaultProxy(ng.port) as px:
        assert get(px.port, "/blob.bin")[2] == PAYLOAD
        assert px.bytes_down > len(PAYLOAD) and [r.method for r in px.requests] == ["GET"]

        px.latency = 0.2
        t0 = time.monotonic()
        get(px.port, "/blob.bin", {"Range": "bytes=0-9"})
        assert time.monotonic() - t0 >= 0.2
        px.latency = 0.0

        px.fail_next = 1
        assert get(px.port, "/blob.bin")[0] == 503
        assert get(px.port, "/blob.bin")[0] == 200

        px.reset_next, px.reset_after = 1, 5000
        with pytest.raises((ConnectionError, http.client.IncompleteRead)):
            get(px.port, "/blob.bin")
        assert get(px.port, "/blob.bin")[2] == PAYLOAD
        assert [r.fault for r in px.requests][-4:] == ["503", "", "reset", ""]

        # only matching requests are faulted, every n-th of them
        px.match, px.fail_every = "other.bin", 1
        assert get(px.port, "/blob.bin")[0] == 200
        assert get(px.port, "/other.bin")[0] == 503


def test_proxy_keeps_alive_across_requests(site):
    """Several requests on one connection are each seen (and faulted) separately."""
    with nginx_server(site) as ng, FaultProxy(ng.port) as px:
        c = http.client.HTTPConnection(HOST, px.port, timeout=10)
        for i in range(3):
            c.request("GET", "/blob.bin", headers={"Range": f"bytes={i * 10}-{i * 10 + 9}"})
            assert c.getresponse().read() == PAYLOAD[i * 10 : i * 10 + 10]
        c.close()
        assert [r.range for r in px.requests] == ["bytes=0-9", "bytes=10-19", "bytes=20-29"]
        assert len(ng.log()) == 3


def test_s3_server_through_proxy(site):
    with s3_server() as s3:
        urls = s3.upload_dir("bucket", site, suffixes=(".bin",))
        assert urls == ["s3://bucket/blob.bin"]
        with FaultProxy(s3.port) as px:
            import boto3

            c = boto3.client("s3", endpoint_url=px.url, aws_access_key_id="testing",
                             aws_secret_access_key="testing", region_name="us-east-1")
            body = c.get_object(Bucket="bucket", Key="blob.bin", Range="bytes=100-199")["Body"].read()
            assert body == PAYLOAD[100:200]
            assert [(r.method, r.range) for r in px.requests] == [("GET", "bytes=100-199")]
            assert c.head_object(Bucket="bucket", Key="blob.bin")["ContentLength"] == len(PAYLOAD)
        assert os.path.basename(urls[0]) == "blob.bin"
