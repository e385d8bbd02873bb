"""Sample parsing, decoding, skipping and collating: the last stages of a
pass, from each step's raw samples to the batch it yields.

Each stage maps a step's lazy sample stream (``reads.Step``) sample by
sample, so one sample is read, parsed and decoded before the next is read,
and passes a ``ShardError`` (a sample that cannot be read, parsed or
decoded) on as a value; ``keep_read`` then raises it (``on_error="raise"``)
or counts, logs and drops it (``"skip"``: the batch is still yielded,
possibly empty, so every rank takes the same steps). Any other exception
(``CacheError``, a process out of descriptors) stops the pass where it
happens.

Stream: per step, the list of sample dicts (webdataset style: ``__key__``, ``__url__``,
the bytes of each member by suffix), decoded, and the collated batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...core.redact import logger
from ..errors import ShardError
from ..formats.audio import decode_audio
from ..formats.tar_samples import parse_sample
from .reads import Raw, Step

log = logger("streambatch.streaming")

Decoder = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class OutputOptions:
    """What a ``StreamingBatches`` yields (its keywords of the same names), checked.

    decode: None (raw bytes), ``"audio"`` (audio -> (float32 tensor (C, T),
        sample_rate), json -> object, txt -> str; ``formats/audio.py``) or a
        function of a sample dict.
    collate_fn: a function of a batch (a list of samples), or None (the list).
    on_error: ``"raise"`` (default) or ``"skip"``: a sample that cannot be
        read or decoded is logged, counted in ``num_skipped`` and left out of
        its batch; the batch is still yielded (possibly empty), so every rank
        takes the same steps.
    """

    decode: Decoder | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    on_error: str = "raise"

    @classmethod
    def build(cls, decode: Any = None, collate_fn: Any = None, on_error: Any = "raise") -> OutputOptions:
        """Check every setting (ValueError/TypeError naming the bad one); ``"audio"`` becomes ``decode_audio``."""
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if decode is not None and decode != "audio" and not callable(decode):
            raise ValueError(f"decode must be None, 'audio' or a function of a sample dict, got {decode!r}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable or None, got {type(collate_fn).__name__}")
        return cls(decode_audio if decode == "audio" else decode, collate_fn, on_error)


def _parse(raw: Raw | ShardError) -> tuple[Raw, dict[str, Any]] | ShardError:
    if isinstance(raw, ShardError):
        return raw
    if raw.sample is not None:  # read whole by its layout (a Parquet row)
        return raw, raw.sample
    try:
        if raw.layout is not None:  # another corpus format's tar bytes (Shar, NeMo)
            return raw, raw.layout.sample(raw.url, raw.offset, raw.key, raw.data, raw.info)
        return raw, parse_sample(raw.data, raw.url, raw.offset, raw.key)
    except ShardError as exc:
        return exc


def parse(steps: Iterator[Step]) -> Iterator[Step]:
    """Raw tar bytes -> (raw, sample dict) (``formats/tar_samples.parse_sample``, or the sample's layout)."""
    for step in steps:
        yield Step(step.index, map(_parse, step.samples))


def _decode(fn: Decoder, item: tuple[Raw, dict[str, Any]] | ShardError) -> tuple[Raw, Any] | ShardError:
    if isinstance(item, ShardError):
        return item
    raw, sample = item
    try:
        out = fn(sample)
    except ImportError:
        raise  # a missing package (e.g. soundfile: the audio extra) is the machine's, never one sample's to skip
    except Exception as exc:
        err = ShardError(f"decoding sample {raw.key!r} of shard {raw.url} (byte {raw.offset}) failed: {exc!r}")
        err.__cause__, err.__suppress_context__ = exc, True  # as `raise ... from exc` where it is raised
        return err
    if out is None:
        return ShardError(f"decode returned None for sample {raw.key!r} of shard {raw.url} (byte {raw.offset}); "
                          "return the sample, or raise to have it skipped with on_error='skip'")
    return raw, out


def decode(steps: Iterator[Step], fn: Decoder | None) -> Iterator[Step]:
    """(raw, sample dict) -> (raw, ``fn(sample)``) (unchanged without a decoder)."""
    if fn is None:
        yield from steps
        return
    for step in steps:
        yield Step(step.index, (_decode(fn, x) for x in step.samples))


def collate(batches: Iterator[list[Any]], fn: Callable[[list[Any]], Any] | None) -> Iterator[Any]:
    """A step's samples -> ``fn(samples)`` (the list itself without a collate function)."""
    for batch in batches:
        yield fn(batch) if fn is not None else batch


def keep_read(steps: Iterator[Step], on_error: str, skip: Callable[[], int]) -> Iterator[tuple[int, list[Any]]]:
    """(epoch step, the samples read) per step. A ``ShardError`` raises with
    ``on_error="raise"``; with ``"skip"`` it is counted (``skip()`` returns
    this process's count so far), logged and left out."""
    for step in steps:
        batch = []
        for x in step.samples:
            if isinstance(x, ShardError):
                if on_error == "raise":
                    raise x
                log.warning("skipping a sample (on_error='skip', %d skipped by this process so far): %s", skip(), x)
            else:
                batch.append(x[1])
        yield step.index, batch
