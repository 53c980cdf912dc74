"""WorkspaceWorkflow (`workspace:<name>`): a workspace's record (`levers9 workspace create`).

It holds the workspace's limits (GPU quota, how many tasks may wait), its default pool (where
`levers9 run` without `--pool` goes; `set_limits` changes it too) and its tokens' records:
label, SHA-256 of the secret, created, expiry, last use, revoked. Never a token: the gateway
makes one, hands it to the caller once, and tells this workflow only its hash. Updates
`set_limits`, `add_token`, `revoke_token` and `delete` (which ends it) decide at once and
await nothing, so their answer means the memo says so; signal `token_used` stamps a token's
last use (the gateway sends it at most once a minute per token). Query `workspace`. It waits
on messages only, so its history grows with them, and it continues as new with its state
past `max_history_events`.

The record is also its memo (`record`), as ClusterWorkflow's: the gateway checks a workspace
token against the memo, which the server answers without a Temporal worker.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from levers9.core.workspaces import (
        WORKSPACE_WORKFLOW,
        WorkspaceLimits,
        WorkspaceState,
        WorkspaceToken,
    )
    from levers9.models import WorkspaceInput


@workflow.defn(name=WORKSPACE_WORKFLOW)
class WorkspaceWorkflow:
    @workflow.init
    def __init__(self, input: WorkspaceInput) -> None:
        self._state: WorkspaceState = input.state

    @workflow.query
    def workspace(self) -> WorkspaceState:
        return self._state

    @workflow.update
    def set_limits(self, limits: WorkspaceLimits) -> WorkspaceState:
        if self._state.deleting:
            raise ApplicationError(f"workspace {self._state.name} is being deleted")
        self._state.set_limits(limits)
        self._publish()
        return self._state

    @workflow.update
    def add_token(self, token: WorkspaceToken) -> str:
        """ "" when the token's record is kept; else why not."""
        refusal = self._state.add_token(token, workflow.now())
        if not refusal:
            self._publish()
        return refusal

    @workflow.update
    def revoke_token(self, token_id: str) -> str:
        """ "" when the token is revoked now (or was); else why not."""
        refusal = self._state.revoke(token_id, workflow.now())
        if not refusal:
            self._publish()
        return refusal

    @workflow.signal
    def token_used(self, token_id: str) -> None:
        if self._state.used(token_id, workflow.now()):
            self._publish()

    @workflow.update
    def delete(self) -> None:
        self._state.deleting = True
        self._publish()

    def _publish(self) -> None:
        workflow.upsert_memo(self._memo())

    def _memo(self) -> dict[str, object]:
        return {"record": self._state.model_dump(mode="json")}

    @workflow.run
    async def run(self, input: WorkspaceInput) -> WorkspaceState:
        await workflow.wait_condition(
            lambda: (
                self._state.deleting
                or workflow.info().get_current_history_length() > input.max_history_events
            )
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not self._state.deleting:
            # With the record: a continued run starts with its first run's start memo otherwise.
            workflow.continue_as_new(
                input.model_copy(update={"state": self._state}), memo=self._memo()
            )
        return self._state
