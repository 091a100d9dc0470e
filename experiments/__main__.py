"""`python -m experiments` is the `lngram-exp` command line."""

from experiments.cli import main

main()
