"""Numba's compile options of the kernels of :mod:`._compiled` (a leaf: :func:`._kernels._build` sets
``cache`` before it imports them, and :mod:`._compiled` reads them).

Only the ``reassoc``/``contract`` fast-math flags are set: NaN and infinity keep their IEEE meaning,
which the verdicts rely on.
"""

#: ``numba.njit`` keyword arguments; ``cache`` False compiles without Numba's on-disk cache.
NJIT = {"cache": True, "nogil": True, "boundscheck": False, "fastmath": {"reassoc", "contract"}}
