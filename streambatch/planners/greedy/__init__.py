"""The seed-exact greedy planner: plan layer in ``plan.py``, Numba kernels in
``kernels.py`` (placement), ``order.py`` (sortish order) and ``mt19937.py``
(CPython's ``random`` reproduced)."""
