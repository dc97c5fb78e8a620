"""``python -m tpuslice.cli``: the same as the ``tpuslice`` command."""

from tpuslice.cli.commands import main

main()
