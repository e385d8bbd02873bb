"""Sample formats inside a shard: tar member scanning (plain, GNU/PAX sparse) and audio headers and decoding.

Stream: bytes of a shard -> (key, member name, offset, size) records; a sample's bytes -> its dict -> decoded
tensors; a batch of samples -> padded (``audio.collate_audio``) or packed, padding-free (``packed.collate_packed``)
tensors."""
