"""`python -m snapanalyze` runs the command line."""

from .cli import run

run()
