"""streambatch: token-budget batch planning for speech/audio training with PyTorch."""

from .plan import Plan
from .planners import PLANNERS, make_plan
from .sampler import DynamicBatchSampler
from .streaming import IndexSummary, ShardError, StreamingBatches, collate_audio, decode_audio, index_shards

__all__ = [
    "DynamicBatchSampler", "Plan", "PLANNERS", "make_plan",
    "StreamingBatches", "index_shards", "IndexSummary", "ShardError", "collate_audio", "decode_audio",
]
__version__ = "0.1.0"
