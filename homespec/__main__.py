"""`python -m homespec ...` is the `homespec` command."""

from homespec.cli import main

main()
