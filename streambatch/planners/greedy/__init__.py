"""The seed-exact greedy planner: plan layer in ``planner.py``; Numba kernels in
``placement.py`` (each sample to a rank of the step), ``order.py`` (the seed's
sortish order) and ``mt19937.py`` (CPython's ``random`` reproduced);
``reference.py`` is its slow pure-Python twin (tests, benchmarks)."""
