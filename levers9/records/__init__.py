"""Temporal's records, read and told: the one way the CLI, the gateway and the activities reach
what Temporal holds of a pool's machines and workers, a task, an endpoint or a joined cluster.

- `found`: one call's answer, with NOT_FOUND read as "no such record" (`or_none`, `delivered`,
  `is_running`) and a query answered within a bound (`query_within`).
- `listing`: the records a visibility query lists (the workflows' `record` memos: machines,
  workers), one controlplane's own; a pool name is checked before it goes into a query.
- `tasks`, `endpoints`, `clusters`: each kind's workflow state mapped to its record (start,
  read, signal, list).
- `workers`: what the gateway tells a worker's and a task's workflows for an agent (register,
  heartbeat, task reports), with Temporal's errors read as gone or unreachable.

It imports of levers9 only the models and the shared core (levers9.temporal for a connection
and the schedules' memos) and temporalio's client; never workflows, activities, the CLI, the
gateway, the worker agent or the dev stack (.importlinter's `records` contract). Not imported
by workflows: it does I/O when called.
"""
