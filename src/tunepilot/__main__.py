"""`python -m tunepilot` runs the command line, as the `tunepilot` script does."""

from tunepilot.cli import main

main()
