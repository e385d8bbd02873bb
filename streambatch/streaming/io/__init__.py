"""Byte access: shard URLs (``urls``), local files and streams (``reader``), one remote object through
fsspec (``objects``: schemes, filesystems, bounded calls, identity; ``retry``: the policy and loop;
``streams``: one GET; ``remote``: ``RemoteShard``), ranged files for indexing (``ranged``), the node-local
cache (``cache`` over ``pieces``, ``prefetch``, ``disk``), a window's remote pieces (``remote_reader``) and the
remote settings of a dataset (``remote_io``).

Stream: a rank's reads of a window (shard, offset, size) -> tar bytes of its samples."""
