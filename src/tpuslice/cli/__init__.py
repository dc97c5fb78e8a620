"""The ``tpuslice`` command line: a thin shell over the library (``commands`` is the entry
point; ``status`` and ``goodput_view`` draw what commands show).

May import: anything in tpuslice except :mod:`tpuslice.testing`.
"""

from tpuslice.cli.commands import main

__all__ = ["main"]
