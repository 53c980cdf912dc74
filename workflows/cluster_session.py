"""ClusterSessionWorkflow (`cluster-session:<name>`): which replica holds a joined cluster's agent
session, so that the others reach the cluster's API through it.

The gateway that takes the agent's `Clusters/ClusterTunnel` signals `held` (signal-with-start)
with its route: its replica's task queue, its gateway's address for the other replicas, the
session's id; one route per replica, the latest last. When the session ends the gateway signals
`released` with the same route, which removes it if it is still that session's. A replica
killed with its session held leaves its route behind; the agent's next session (on another
replica) comes after it, and readers try the latest first, skipping any that refuses.

The routes are the memo `routes` (the server answers it: a replica reads it without a polling
Temporal worker); query `routes` says the same. The run ends when no route is left, and
continues as new past `max_history_events`: its history grows with the agent's reconnections.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from levers9.providers.joined import CLUSTER_SESSION_WORKFLOW, ClusterRoute, ClusterSessionInput


@workflow.defn(name=CLUSTER_SESSION_WORKFLOW)
class ClusterSessionWorkflow:
    @workflow.init
    def __init__(self, input: ClusterSessionInput) -> None:
        self._routes: list[ClusterRoute] = list(input.routes)

    @workflow.query
    def routes(self) -> list[ClusterRoute]:
        return self._routes

    @workflow.signal
    def held(self, route: ClusterRoute) -> None:
        others = [r for r in self._routes if r.task_queue != route.task_queue]
        self._routes = [*others, route]
        self._publish()

    @workflow.signal
    def released(self, route: ClusterRoute) -> None:
        self._routes = [r for r in self._routes if r != route]
        self._publish()

    def _publish(self) -> None:
        workflow.upsert_memo({"routes": [r.model_dump(mode="json") for r in self._routes]})

    @workflow.run
    async def run(self, input: ClusterSessionInput) -> None:
        self._publish()
        await workflow.wait_condition(
            lambda: (
                not self._routes
                or workflow.info().get_current_history_length() > input.max_history_events
            )
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._routes:
            workflow.continue_as_new(input.model_copy(update={"routes": self._routes}))
