"""Streaming from local WebDataset shards: index them once, then train on StreamingBatches.

    python examples/streaming_local.py                      # shards written to a temporary directory
    python examples/streaming_local.py --dir data/example   # or kept in DIR
    torchrun --nproc-per-node 2 examples/streaming_local.py --dir data/example

The shards hold WAV audio and a json member with each utterance's duration in seconds. They are
indexed with lengths of ceil(duration x 50) frames (what `streambatch index ... --frames-per-second
50` does), streamed in token-budget batches (batch size x longest clip <= 2,000 frames = 40 s of
audio), decoded and padded by collate_audio. Mid-epoch, the loader's state is saved and a fresh
loader resumes from it exactly where the first stopped.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch.distributed as dist
from torch.utils.data import DataLoader

from streambatch import StreamingBatches, collate_audio, index_shards

from common import write_shards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="write the shards here and keep them (default: a temporary directory)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    if "RANK" in os.environ:  # under torchrun: StreamingBatches reads rank and world size from torch.distributed
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0

    directory = args.dir or tempfile.mkdtemp(prefix="streambatch-example-")
    pattern = os.path.join(directory, "train-{000000..000007}.tar")
    if rank == 0:
        pattern = write_shards(directory, shards=8, per_shard=40)
        summary = index_shards(pattern, length_from="json:duration", frames_per_second=50, progress=False)
        print(f"indexed {summary.shards} shards, {summary.samples} utterances")
    if dist.is_initialized():
        dist.barrier()  # the other ranks wait for the shards and their sidecars

    ds = StreamingBatches(pattern, max_batch_tokens=2_000, max_batch_size=32, decode="audio",
                          collate_fn=collate_audio, window_samples=160)
    loader = DataLoader(ds, batch_size=None, num_workers=args.workers)
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        seconds = 0.0
        for batch in loader:
            audio, lengths = batch["audio"], batch["audio_lengths"]  # (B, T) float32, (B,) samples
            assert audio.shape[0] == lengths.shape[0]  # ... a training step on the batch ...
            seconds += float(lengths.sum()) / batch["sample_rate"]
        s = ds.epoch_summary()
        print(f"rank {rank}: epoch {epoch}: {len(ds)} batches, {seconds / 60:.1f} min of audio "
              f"(padded slots {s.padded}, dropped {s.dropped})")

    # Exact mid-epoch resume: torchdata's StatefulDataLoader saves each worker's position.
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        print("install torchdata for the resume part of this example")
        return
    ds.set_epoch(args.epochs)
    first = StatefulDataLoader(ds, batch_size=None, num_workers=args.workers)
    seen = []
    for i, batch in enumerate(first):
        seen.append(batch["keys"])
        if i == 2:
            state = first.state_dict()  # what a checkpoint would hold
            break
    del first
    resumed = StatefulDataLoader(ds, batch_size=None, num_workers=args.workers)
    resumed.load_state_dict(state)
    rest = [batch["keys"] for batch in resumed]
    whole = [batch["keys"] for batch in DataLoader(ds, batch_size=None, num_workers=args.workers)]
    assert seen + rest == whole, "the resumed loader should continue exactly where the first stopped"
    print(f"rank {rank}: resumed after 3 of {len(whole)} batches: the same batches as an uninterrupted epoch")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
