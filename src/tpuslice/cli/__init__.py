"""The ``tpuslice`` command line: a thin shell over the library (``commands`` is the entry
point; ``connect``, ``jobs``, ``owners`` and ``status`` are its command groups and views).

May import: anything in tpuslice except :mod:`tpuslice.testing`.
"""

from tpuslice.cli.commands import main

__all__ = ["main"]
