"""`python -m levers9 ...`: the CLI, for processes started without the console script."""

from levers9.cli.main import main

main()
