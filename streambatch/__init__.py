"""streambatch: token-budget batch planning for speech/audio training with PyTorch."""

from __future__ import annotations

import importlib
from typing import Any

from .core.cost import CostModel
from .core.mix import Mix
from .core.plan import Plan
from .planners import PLANNERS, make_plan

# The torch/webdataset glue is imported on first use, so that planning and the
# command line's --help do not pay for importing torch.
_LAZY = {
    "DynamicBatchSampler": ".torch_glue.sampler",
    "StreamingBatches": ".streaming",
    "Source": ".streaming",
    "Shar": ".streaming",
    "NemoTarred": ".streaming",
    "Parquet": ".streaming",
    "index_shards": ".streaming",
    "IndexSummary": ".streaming",
    "ShardError": ".streaming",
    "CacheError": ".streaming",
    "collate_audio": ".streaming",
    "collate_packed": ".streaming.formats.packed",
    "RetryPolicy": ".streaming",
    "decode_audio": ".streaming",
    "GlobalBatchSampler": ".integrations.accelerate",
    "seconds_to_frames": ".core.units",
    "LongSampleWarning": ".core.long_samples",
    "PlanChangedWarning": ".core.state",
    "MemoryModel": ".core.memory",
    "LimitCurve": ".core.limits",
    "PreflightError": ".torch_glue.preflight",
}

__all__ = ["CostModel", "Mix", "Plan", "PLANNERS", "make_plan", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'streambatch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
