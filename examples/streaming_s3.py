"""Streaming from S3 (or any S3-compatible store): upload shards, index them in place, train from the catalog.

    pip install 'streambatch[s3]' 'moto[server]'       # s3fs; moto only for the local stand-in server
    python examples/streaming_s3.py                     # starts moto's S3 server on 127.0.0.1 for the run
    python examples/streaming_s3.py --endpoint-url http://minio:9000 --bucket my-bucket   # your store

With --endpoint-url, credentials come from the environment as usual (AWS_ACCESS_KEY_ID, ...).
`streambatch index` reads only the tar headers and json members of remote shards (ranged GETs),
writes a sidecar next to each shard and one catalog file; StreamingBatches then plans from that
one file and streams in shard mode: each rank downloads its own contiguous pieces of every
window, one GET per shard, into a node-local cache, so each byte crosses the network once.
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import socket
import tempfile

from torch.utils.data import DataLoader

from streambatch import StreamingBatches, collate_audio, index_shards

from common import write_shards


def local_s3() -> tuple[str, object]:
    """moto's S3 server on a free 127.0.0.1 port: (endpoint URL, server to stop)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")  # moto takes any credentials
    return f"http://127.0.0.1:{port}", server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint-url", help="S3 endpoint (default: moto's server, started here)")
    p.add_argument("--bucket", default="streambatch-example")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    server = None
    endpoint = args.endpoint_url
    if endpoint is None:
        endpoint, server = local_s3()
    try:
        run(endpoint, args.bucket, args.workers)
    finally:
        if server is not None:
            server.stop()


def run(endpoint: str, bucket: str, workers: int) -> None:
    import s3fs

    options = {"client_kwargs": {"endpoint_url": endpoint}}  # fsspec (s3fs) options
    fs = s3fs.S3FileSystem(**options)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    with tempfile.TemporaryDirectory() as local:
        write_shards(local, shards=8, per_shard=40)
        for path in sorted(glob.glob(os.path.join(local, "*.tar"))):
            fs.put_file(path, f"{bucket}/train/{os.path.basename(path)}")
    shards = f"s3://{bucket}/train/train-{{000000..000007}}.tar"

    # Sidecars next to the shards and one catalog, read through ranged GETs (about 2 KiB per sample).
    # The command line does the same: streambatch index 's3://...' --fps 50 -s client_kwargs.endpoint_url=...
    summary = index_shards(shards, length_from="json:duration", frames_per_second=50, storage_options=options,
                           progress=False)
    catalog = f"s3://{bucket}/train/streambatch.catalog.npz"
    print(f"indexed {summary.shards} shards in S3, {summary.samples} utterances; catalog {catalog}")

    with tempfile.TemporaryDirectory() as cache:
        ds = StreamingBatches(catalog, max_batch_tokens=2_000, max_batch_size=32, storage_options=options,
                              decode="audio", collate_fn=collate_audio, cache_dir=cache)  # read_mode "shard"
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        for epoch in range(2):
            ds.set_epoch(epoch)
            keys = [k for batch in loader for k in batch["keys"]]
            print(f"epoch {epoch}: {len(ds)} batches, {len(keys)} utterances, {len(set(keys))} distinct "
                  f"(read mode {ds.config.read_mode})")


if __name__ == "__main__":
    main()
