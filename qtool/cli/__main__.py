"""`python -m qtool.cli`."""

from qtool.cli import main

main()
