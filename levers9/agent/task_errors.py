"""What the task calls of the agent refuse with (levers9.agent.service maps each to its gRPC
code): an unknown task, one no longer running, a task or request it will not take, an agent
shutting down, a published port that does not answer."""

from __future__ import annotations


class TaskNotFound(LookupError):
    pass


class TaskNotRunning(RuntimeError):
    pass


class InvalidTask(ValueError):
    pass


class ShuttingDown(RuntimeError):
    pass


class PortUnavailable(ConnectionError):
    """Nothing accepts connections on the task's port (yet); the message says which."""
