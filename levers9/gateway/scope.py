"""Who a gateway call is from, and which workspace it acts in: one rule for every service that
holds a workspace's objects (boxes, disks, endpoints, volumes, pools' usage, workspaces).

- The caller: its bearer token turned into an Identity by the Authority, or UNAUTHENTICATED
  saying why (never quoting the token).
- The workspace: a workspace token acts in its own. Naming another is PERMISSION_DENIED, on a
  read as on a write, as kubectl answers Forbidden for a namespace its user may not read: the
  answer names the caller's workspace and the fix, and says nothing of what the other holds (it
  is the same whether or not the object, or the workspace, exists). An object of another
  workspace reached without naming it (a name looked up in the caller's own workspace) is
  NOT_FOUND in the words of a missing one, since it is looked up in the caller's workspace only.
- The operator acts in `default`, or in the workspace it names (a valid name; to create in it,
  one that runs).
"""

from __future__ import annotations

from typing import Any

import grpc

from levers9.core.workspaces import DEFAULT_WORKSPACE, name_problem
from levers9.gateway.errors import Unauthenticated, shown
from levers9.gateway.roles import Authority, Identity

Context = grpc.aio.ServicerContext[Any, Any]


async def identify(authority: Authority, context: Context) -> Identity:
    """The caller of this call, or the call aborted UNAUTHENTICATED with the reason."""
    try:
        return await authority.identify(context.invocation_metadata() or ())
    except Unauthenticated as exc:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
        raise  # abort raises; for the type checker


def others_refusal(
    identity: Identity, asked: str, objects: str, *, field: str = "workspace"
) -> str:
    """The PERMISSION_DENIED words for a workspace token naming workspace `asked`."""
    return (
        f"{field}: a workspace token (workspace {identity.workspace}) acts on its own"
        f" workspace's {objects} only, not on workspace {shown(asked)}; leave --workspace out,"
        " or ask the operator"
    )


async def call_workspace(
    authority: Authority,
    identity: Identity,
    asked: str,
    context: Context,
    *,
    objects: str,
    creating: bool = False,
    field: str = "workspace",
) -> str:
    """The workspace the call acts in (module docstring), or the call aborted saying why.
    `objects` names what the service holds ("boxes", "disks"...), for the refusal's words;
    `field` is the request's field that names the workspace."""
    if not identity.operator:
        if asked and asked != identity.workspace:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                others_refusal(identity, asked, objects, field=field),
            )
        return identity.own_workspace
    if not asked or asked == DEFAULT_WORKSPACE:
        return DEFAULT_WORKSPACE
    problem = name_problem(asked)
    if problem is not None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")
    if creating and not await authority.workspace_exists(asked):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{field}: no workspace {asked} (`levers9 workspace list`)",
        )
    return asked
