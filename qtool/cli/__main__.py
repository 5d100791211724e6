"""`python -m qtool.cli`."""

from qtool.cli.app import main

main()
