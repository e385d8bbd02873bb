"""Process-level state shared across DataLoader workers and ranks: shared-memory counters (epoch, resume
position, skips) and the failure channel through ``torch.distributed``'s store.

Stream: nothing: counters and a failure of one rank raised on every rank."""
