"""`python -m levers9 ...`: the CLI, for processes started without the console script."""

from levers9.cli.main import app

app(prog_name="levers9")
