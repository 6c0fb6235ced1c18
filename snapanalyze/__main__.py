"""`python -m snapanalyze` runs the command line."""

from .cli import main

main()
