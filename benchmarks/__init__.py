"""Benchmarks: each module a program (`python benchmarks/<name>.py`, or `python -m
benchmarks.<name>`); figures and how they were taken in benchmarks/README.md."""
