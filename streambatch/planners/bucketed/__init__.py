"""The bucketed planner: plan layer in ``planner.py`` (padded) and
``packed.py`` (``pack=True``); Numba kernels in ``sort.py`` (bucket sort),
``steps.py`` (step layout, with ``layouts.py`` and ``head.py``) and
``packed_steps.py`` (packed bins)."""
