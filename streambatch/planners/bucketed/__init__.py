"""The bucketed planner: plan layer in ``plan.py``, Numba kernels in
``kernels.py``."""
