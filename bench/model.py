"""A small speech encoder to time real training steps with (not part of the library).

Conv subsampling (2 x stride 2) of 80-dim feature frames, a 4-layer
transformer encoder (d=144, 4 heads, FFN 576; ~1.1M parameters), a CTC loss
over 32 symbols and an AdamW step: the shape of an ASR/TTS encoder's step,
small enough for a CPU. ``make_step()`` returns ``step(batch_size, length)``
for ``streambatch calibrate --script bench/model.py:make_step``; lengths are
feature frames.

    streambatch calibrate --script bench/model.py:make_step --max-batch-tokens 4000 --max-length 800
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES, DIM, HEADS, LAYERS, VOCAB = 80, 144, 4, 4, 32


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub = nn.Sequential(nn.Conv1d(FEATURES, DIM, 3, stride=2, padding=1), nn.GELU(),
                                 nn.Conv1d(DIM, DIM, 3, stride=2, padding=1), nn.GELU())
        layer = nn.TransformerEncoderLayer(DIM, HEADS, 4 * DIM, dropout=0.0, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, 80) float32 -> (B, ceil(T / 4), VOCAB) log-probabilities."""
        h = self.sub(x.transpose(1, 2)).transpose(1, 2)
        return self.out(self.enc(h, src_key_padding_mask=pad)).log_softmax(-1)


def make_step(seed: int = 0, threads: int | None = 1, wrap=None, device: str = "cpu"):
    """``step(batch_size, length)``: one forward + CTC backward + AdamW step on
    random features of that padded shape (``threads``: torch's intra-op
    threads, 1 by default so timings do not fight other processes; ``wrap``:
    applied to the model, e.g. ``DistributedDataParallel`` for a real
    multi-process step with its gradient all-reduce; ``device``: where the
    model and its batches live, e.g. ``"cuda"``: the step returns after the
    device has finished it)."""
    if threads is not None:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    torch.manual_seed(seed)  # the same initial weights in every process
    model = Encoder().to(dev)
    if wrap is not None:
        model = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ctc = nn.CTCLoss(zero_infinity=True)

    def step(batch_size: int, length: int) -> float:
        x = torch.randn(batch_size, length, FEATURES, generator=g, device=dev)
        logp = model(x)
        t = logp.shape[1]
        target_len = max(1, t // 4)
        targets = torch.randint(1, VOCAB, (batch_size, target_len), generator=g, device=dev)
        loss = ctc(logp.transpose(0, 1), targets, torch.full((batch_size,), t, device=dev),
                   torch.full((batch_size,), target_len, device=dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


if __name__ == "__main__":
    import time

    step = make_step()
    for b, L in ((1, 100), (8, 400), (4, 800)):
        step(b, L)
        t = time.perf_counter()
        step(b, L)
        print(f"B={b:3d} L={L:4d}: {time.perf_counter() - t:.4f} s")
    print(f"{sum(p.numel() for p in Encoder().parameters()):,} parameters")
