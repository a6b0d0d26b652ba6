"""`python -m corral.cli`: the same as the `corral` console script."""

from corral.cli import main

main()
