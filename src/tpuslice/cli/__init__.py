"""The ``tpuslice`` command line: a thin shell over the library (``commands`` is the entry
point; ``connect`` joins a cluster; ``jobs``, ``owners``, ``health`` and ``goodput`` add
commands; ``status`` and ``goodput_view`` draw what they show; ``waiting`` is what a
command shows while it waits, and its messages in the command line's terms).

May import: anything in tpuslice except :mod:`tpuslice.testing`.
"""

from tpuslice.cli.commands import main

__all__ = ["main"]
