"""ClusterWorkflow (`cluster:<name>`): a joined cluster's record (`levers9 cluster join`).

It holds the pool the join made (name, cards, node selector, namespace, worker image), the join
token's SHA-256 and expiry, and when the agent spent it. Update `exchange` (the gateway's, at the
agent's first contact) spends the token or says why it cannot be (used, expired, another join's);
it decides at once and awaits nothing. Query `cluster`. Signal `leave` ends it (`levers9 cluster
leave`). It waits on signals and updates only, so its history grows with joins and leaves.

The record is also its memo (`record`, set when the join starts, upserted when it changes,
carried when it continues as new): the server answers it without a Temporal worker, so a
controlplane starting up (before its own worker polls) and the CLI with the controlplane down
read it there, never by the query.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from levers9.models import CLUSTER_WORKFLOW, ClusterInput
    from levers9.providers.joined import ClusterState


@workflow.defn(name=CLUSTER_WORKFLOW)
class ClusterWorkflow:
    @workflow.init
    def __init__(self, input: ClusterInput) -> None:
        self._state: ClusterState = input.state
        self._leave = False

    @workflow.query
    def cluster(self) -> ClusterState:
        return self._state

    @workflow.update
    def exchange(self, digest: str) -> str:
        """ "" when the join token with this SHA-256 is spent now; else why it is refused."""
        refusal = self._state.exchange(digest, workflow.now())
        if not refusal:
            self._publish()
        return refusal

    @workflow.signal
    def leave(self) -> None:
        self._leave = True
        self._state.leaving = True
        self._publish()

    def _publish(self) -> None:
        workflow.upsert_memo(self._memo())

    def _memo(self) -> dict[str, object]:
        return {"record": self._state.model_dump(mode="json")}

    @workflow.run
    async def run(self, input: ClusterInput) -> ClusterState:
        await workflow.wait_condition(
            lambda: (
                self._leave
                or workflow.info().get_current_history_length() > input.max_history_events
            )
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not self._leave:
            # With the record: a continued run starts with its first run's start memo otherwise
            # (the server carries that one, not what was upserted since).
            workflow.continue_as_new(
                input.model_copy(update={"state": self._state}), memo=self._memo()
            )
        return self._state
