"""streambatch: token-budget batch planning for speech/audio training with PyTorch."""

from .plan import Plan
from .planners import PLANNERS, make_plan
from .sampler import DynamicBatchSampler

__all__ = ["DynamicBatchSampler", "Plan", "PLANNERS", "make_plan"]
__version__ = "0.1.0"
