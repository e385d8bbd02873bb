"""A cross-rank failure channel for fatal read errors in the middle of an epoch.

Why: in shard mode each rank streams only its own shards, so a shard that
cannot be read (retries exhausted, corrupt tar, decode failure) raises on the
rank that reads it alone. The other ranks would train on and then block in the
next collective until its timeout. So a failing pass writes its error to
torch.distributed's key-value store (the TCPStore the process group already
has), and every pass of every rank checks that key before each batch (one
round trip per batch: cheap at tens of ranks) and raises a ``ShardError``
naming the failing rank and its error. A pass that ends waits (polling, at most
``wait`` seconds) until every rank's passes over the epoch have ended or one
failed, so that a rank that finished early still hears of a late failure.

The main process keeps only picklable connection details (host, port, a key
namespace); each process (a forked or spawned DataLoader worker, or the main
process with ``num_workers=0``) opens its own client lazily. No collectives.
Keys are per dataset (fingerprint and construction count), per epoch, and per
job attempt (a nonce agreed through the process group's own prefixed store),
so a later epoch or a restarted job is not poisoned; they are not deleted
(a few bytes per failed epoch). Without an initialised process group of more
than one rank, or when its store is not a TCPStore (FileStore, HashStore), the
channel is off: a failure raises on its own rank only, as before.

Stream: a pass's batches, passed on until any rank fails (``watched``): a failure of one rank, raised on every
rank."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ...core.redact import logger, scrub, scrub_exception
from ..errors import ShardError

log = logger("streambatch.streaming")

_made: dict[int, int] = {}  # fingerprint -> datasets this process built with it (same order on every rank)


class ForeignFailure(ShardError):
    """Another rank (or another worker of this rank) failed reading its shards."""


@dataclass
class FailureChannel:
    host: str
    port: int
    namespace: str
    rank: int
    world_size: int
    # Ranks in DDP run within a few batches of each other, so a late failure
    # lands within seconds; the bound also caps how long a DataLoader worker
    # that prefetched to the end of its pass delays a job stopping mid-epoch
    # (torchdata's StatefulDataLoader waits for its workers on shutdown).
    wait: float = 60.0
    # Opening a client waits at most this long. A forked DataLoader worker of rank 0 inherits the listening
    # socket of rank 0's store server; once rank 0's group is gone the kernel still accepts a connection on
    # that socket and nobody answers, and TCPStore's own timeout does not cover that (seen on torch 2.13).
    connect_timeout: float = 15.0
    _store: Any = field(default=None, repr=False, compare=False)
    _pid: int = field(default=0, repr=False, compare=False)
    _off: bool = field(default=False, repr=False, compare=False)  # the store went away (``_lost``)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None, "_pid": 0}  # a socket does not travel to a worker

    def _client(self) -> Any:
        if self._store is None or self._pid != os.getpid():  # a forked worker opens its own connection
            self._store = _connect(self.host, self.port, self.connect_timeout)
            self._pid = os.getpid()
        return self._store

    def _key(self, epoch: int, what: str) -> str:
        return f"{self.namespace}/e{epoch}/{what}"

    def report(self, epoch: int, exc: BaseException) -> None:
        """Tell every rank that this rank's pass over ``epoch`` failed (best effort: the error is raised anyway)."""
        if isinstance(exc, ForeignFailure):
            return
        try:
            what = scrub(exc) if isinstance(exc, ShardError) else f"{type(exc).__name__}: {scrub(exc)}"
            self._client().set(self._key(epoch, "failed"), f"rank {self.rank} failed reading its shards in epoch "
                                                            f"{epoch}: {what}")
        except Exception as err:  # the rank's own error still surfaces
            log.warning("could not tell the other ranks of this read failure: %r", err)

    def _lost(self, err: BaseException) -> None:
        # The store lives in rank 0's process: unreachable means rank 0 has
        # exited or its group was destroyed (a job ending, a test's old world
        # stopping at a checkpoint). That is no read failure, and any real
        # collective fails on its own, so this process stops listening instead
        # of inventing an error.
        if not self._off:
            log.warning("rank %d: the torch.distributed store at %s:%d is gone (%r); other ranks' read failures "
                        "are no longer heard in this process", self.rank, self.host, self.port, err)
        self._off, self._store = True, None

    def check(self, epoch: int) -> None:
        """Raise a ``ForeignFailure`` if any rank's pass over ``epoch`` failed."""
        if self._off:
            return
        key = self._key(epoch, "failed")
        try:
            failed = self._client().check([key])
            message = self._client().get(key).decode("utf-8", "replace") if failed else ""
        except Exception as err:
            self._lost(err)
            return
        if failed:
            raise ForeignFailure(f"{message} (rank {self.rank} stops too)")

    def finish(self, epoch: int, passes: int) -> None:
        """At the end of a pass (one of ``passes`` per rank: its DataLoader workers): wait until every
        rank's passes have ended or one failed (then raise), for at most ``wait`` seconds."""
        if self._off:
            return
        try:
            ended = self._client().add(self._key(epoch, f"ended{passes}"), 1)
        except Exception as err:
            self._lost(err)
            return
        group = self.world_size * passes
        target = -(-ended // group) * group  # this round of passes over the epoch (an epoch may be re-read)
        deadline, pause = time.monotonic() + self.wait, 0.01
        while True:
            self.check(epoch)
            try:
                if self._off or self._client().add(self._key(epoch, f"ended{passes}"), 0) >= target:
                    return
            except Exception as err:
                self._lost(err)
                return
            if time.monotonic() > deadline:
                log.warning("rank %d: other ranks' passes over epoch %d had not ended after %.0f s; going on",
                            self.rank, epoch, self.wait)
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.2)


def _connect(host: str, port: int, timeout: float) -> Any:
    """A TCPStore client of the store at host:port, or TimeoutError after ``timeout`` seconds. The
    connection is made in a daemon thread: a connect that never returns (see ``connect_timeout``) is
    left behind in it rather than hanging this process."""
    import torch.distributed as dist

    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["store"] = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                         timeout=timedelta(seconds=10))
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    t = threading.Thread(target=connect, name="streambatch-store-connect", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer from the torch.distributed store at {host}:{port} within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["store"]


def watched(items: Iterable[Any], channel: FailureChannel | None, epoch: int, passes: int) -> Iterator[Any]:
    """The stage that ends a pass: ``items`` (a pass's batches over ``epoch``)
    passed on, except that before each one a failure of another rank (or
    worker) is raised here too, and after the last this pass waits until the
    ``passes`` of every rank have ended or one failed (``FailureChannel``; with
    no channel, nothing to hear). An error of this pass is scrubbed of
    credentials before it leaves, and told to the other ranks."""
    try:
        for item in items:
            if channel is not None:
                channel.check(epoch)  # another rank failed: stop too, rather than train on and hang
            yield item
        if channel is not None:
            channel.finish(epoch, passes)  # hear of a failure later in another rank's pass
    except Exception as exc:
        scrub_exception(exc)  # before it leaves the pass (and reaches other ranks): no credentials in it
        if channel is not None:
            channel.report(epoch, exc)
        raise


def open_channel(fingerprint: int, rank: int, world_size: int) -> FailureChannel | None:
    """In the main process at construction: the channel, or None when there is no usable TCPStore."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if world_size <= 1 or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
            return None
        store = c10d._get_default_store()
        tcp = store
        while isinstance(tcp, dist.PrefixStore):
            tcp = tcp.underlying_store
        if not isinstance(tcp, dist.TCPStore):
            return None
        # one nonce per job attempt: the first rank to ask sets it, through the process group's own namespace
        nonce = store.compare_set("streambatch/failures/nonce", "", uuid.uuid4().hex).decode()
    except Exception as err:  # no store (or an unusual one): no channel, as before
        log.debug("no cross-rank failure channel: %r", err)
        return None
    _made[fingerprint] = _made.get(fingerprint, 0) + 1
    return FailureChannel(tcp.host, tcp.port, f"streambatch/{nonce}/{fingerprint:x}/{_made[fingerprint]}", rank,
                          world_size)
