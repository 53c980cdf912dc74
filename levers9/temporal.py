"""Talking to the Temporal server: connect, search attributes, the reconcile schedules (the
records of machines, workers, tasks, endpoints and clusters: levers9.records).

Not imported by workflows (it does I/O when called).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
    TLSConfig,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from levers9 import telemetry
from levers9.config import ControlplaneSettings
from levers9.contract import DEFAULT_RUNTIME
from levers9.errors import Unreachable
from levers9.logs import get_logger, quiet_sdk_messages
from levers9.models import (
    RECONCILE_POOL_WORKFLOW,
    ReconcilePoolInput,
    reconcile_schedule_id,
)
from levers9.records.found import delivered, or_none
from levers9.search_attributes import POOL_NAME, SEARCH_ATTRIBUTES

RECONCILE_PREFIX = "reconcile:"
MEMO_TASK_QUEUE = "levers9.taskQueue"
MEMO_SOURCE = "levers9.source"
"""Who made a pool: `values` (the controlplane's values) or `joined` (`levers9 cluster join`);
a join never takes, and a leave never removes, a pool of the values."""
VALUES, JOINED = "values", "joined"
MEMO_SIMULATED_GPUS = "levers9.simulatedGpus"
"""True when the pool's values say `simulatedGpus: true` (the sandbox): `levers9 pool check`
reads it to tell a simulated pool's empty container from a broken driver's."""
MEMO_RUNTIMES = "levers9.runtimes"
"""The runtimes the pool's tasks may name (its `runtimes`, `runtime` first): a submit naming
another is refused at once. A memo without it (a join, an older schedule): the default's."""
RECONCILE_RUN_TIMEOUT = timedelta(minutes=2)
PASS_POLL_S = 1.0

log = get_logger(__name__)

quiet_sdk_messages()


def _tls(settings: ControlplaneSettings) -> bool | TLSConfig:
    files = (
        settings.temporal_tls_cert_file,
        settings.temporal_tls_key_file,
        settings.temporal_tls_server_ca_file,
    )
    if not any(files):
        # Temporal Cloud with an API key needs TLS; a local dev server does not.
        return settings.temporal_tls or settings.temporal_api_key is not None
    cert, key, ca = (path.expanduser().read_bytes() if path else None for path in files)
    return TLSConfig(client_cert=cert, client_private_key=key, server_root_ca_cert=ca)


async def connect(settings: ControlplaneSettings, runtime: Runtime | None = None) -> Client:
    """A client with the pydantic data converter and the tracing interceptor, as every
    levers9 process uses (workers made from it inherit the interceptor); `runtime` is the
    controlplane's, with its metrics endpoint."""
    api_key = settings.temporal_api_key
    try:
        return await Client.connect(
            settings.temporal_address,
            namespace=settings.temporal_namespace,
            api_key=api_key.get_secret_value() if api_key else None,
            tls=_tls(settings),
            data_converter=pydantic_data_converter,
            interceptors=telemetry.interceptors(),
            runtime=runtime,
        )
    except RuntimeError as exc:
        if not str(exc).startswith("Failed client connect"):
            raise
        reason, fix = connect_problem(settings, str(exc))
        message = f"cannot reach Temporal at {settings.temporal_address} ({reason}): {fix}"
        if api_key:
            message = message.replace(api_key.get_secret_value(), "***")
        raise Unreachable(message) from None


_CA_SETTING = "temporalTlsServerCaFile (LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE)"
_CLIENT_SETTINGS = (
    "temporalTlsCertFile and temporalTlsKeyFile"
    " (LEVERS9_TEMPORAL_TLS_CERT_FILE, LEVERS9_TEMPORAL_TLS_KEY_FILE)"
)


def connect_problem(settings: ControlplaneSettings, message: str) -> tuple[str, str]:
    """Why the SDK's `Failed client connect: ...` failed, in words, and the setting that fixes
    it: TLS and authentication problems name their setting, not the address."""
    tls = settings.temporal_tls or settings.temporal_api_key is not None
    tls = tls or any(
        path is not None
        for path in (
            settings.temporal_tls_cert_file,
            settings.temporal_tls_key_file,
            settings.temporal_tls_server_ca_file,
        )
    )
    ca = settings.temporal_tls_server_ca_file
    if "UnknownIssuer" in message:
        trusted = f"the CA in {ca}" if ca else "a CA of the system's roots"
        return (
            f"its TLS certificate is not signed by {trusted}",
            f"set {_CA_SETTING} to the CA that signed the server's certificate",
        )
    if "NotValidForName" in message:
        return (
            "its TLS certificate does not name that host",
            "set TEMPORAL_ADDRESS (temporalAddress) to a name its certificate holds",
        )
    if "code: Unauthenticated" in message or "code: PermissionDenied" in message:
        if settings.temporal_api_key is None:
            return "it wants an API key", "set TEMPORAL_API_KEY (temporalApiKey)"
        return (
            "it refused the API key",
            f"set TEMPORAL_API_KEY (temporalApiKey) to a key valid for namespace"
            f" {settings.temporal_namespace}",
        )
    if tls and "InvalidContentType" in message:
        return (
            "it does not speak TLS",
            "unset LEVERS9_TEMPORAL_TLS and the LEVERS9_TEMPORAL_TLS_*_FILE settings"
            " (an API key turns TLS on too), or point TEMPORAL_ADDRESS at its TLS port",
        )
    closed = ("close_notify", "UnexpectedEof", "BrokenPipe", '"connection closed"')
    if tls and any(word in message for word in closed):
        if settings.temporal_tls_cert_file is None:
            return (
                "it closed the TLS connection: it may want a client certificate, for mutual TLS",
                f"set {_CLIENT_SETTINGS}",
            )
        return (
            "it closed the TLS connection: it may have refused the client certificate",
            f"set {_CLIENT_SETTINGS} to a certificate its client CA signed",
        )
    if not tls and any(word in message for word in closed):
        return (
            "it closed the connection: it may serve TLS only",
            f"set LEVERS9_TEMPORAL_TLS=true (temporalTls), with {_CA_SETTING} for a CA of your own",
        )
    return (
        _connect_reason(message),
        "set TEMPORAL_ADDRESS (temporalAddress), or start the dev stack with levers9 dev up",
    )


def _connect_reason(message: str) -> str:
    """The OS's words from the SDK's `Failed client connect: ... message: "..."`."""
    marker = 'message: "'
    start = message.rfind(marker)
    if start < 0:
        return message.removeprefix("Failed client connect: ").strip()[:200]
    end = message.find('"', start + len(marker))
    return message[start + len(marker) : end if end > 0 else None].lower()


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Adds the search attributes of DESIGN.md that the namespace lacks; returns those added."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = [key for key in SEARCH_ATTRIBUTES if key.name not in existing.custom_attributes]
    if not missing:
        return []
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace,
                search_attributes={
                    key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for key in missing
                },
            )
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.PERMISSION_DENIED:
            raise
        names = ", ".join(key.name for key in missing)
        raise RuntimeError(
            f"cannot add search attributes {names} to namespace {namespace}: permission denied."
            " On Temporal Cloud add them once with"
            f" `tcld namespace search-attributes add --namespace {namespace}"
            " --search-attribute PoolName=Keyword ...` (see docs/operations.md)"
        ) from None
    return [key.name for key in missing]


def reconcile_schedule(pool_name: str, settings: ControlplaneSettings) -> Schedule:
    """The `reconcile:<pool>` schedule: every interval, overlap SKIP."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RECONCILE_POOL_WORKFLOW,
            ReconcilePoolInput(pool_name=pool_name),
            id=reconcile_schedule_id(pool_name),
            task_queue=settings.task_queue,
            run_timeout=RECONCILE_RUN_TIMEOUT,
            typed_search_attributes=TypedSearchAttributes(
                [SearchAttributePair(POOL_NAME, pool_name)]
            ),
        ),
        spec=ScheduleSpec(
            intervals=[
                ScheduleIntervalSpec(every=timedelta(seconds=settings.reconcile_interval_seconds))
            ]
        ),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


@dataclasses.dataclass(frozen=True)
class ScheduleSync:
    created: list[str]
    updated: list[str]
    deleted: list[str]


async def _managed_schedule_ids(client: Client, task_queue: str) -> set[str]:
    ids = set()
    async for listed in await client.list_schedules():
        if not listed.id.startswith(RECONCILE_PREFIX):
            continue
        memo = await listed.memo()
        if memo.get(MEMO_TASK_QUEUE) == task_queue:
            ids.add(listed.id)
    return ids


async def pool_names(client: Client, task_queue: str) -> list[str]:
    """The pools this controlplane reconciles (its `reconcile:<pool>` schedules), sorted."""
    ids = await _managed_schedule_ids(client, task_queue)
    return sorted(schedule_id.removeprefix(RECONCILE_PREFIX) for schedule_id in ids)


async def has_pool(client: Client, task_queue: str, pool_name: str) -> bool:
    """Whether this controlplane reconciles the pool: its schedule, described (read at once,
    unlike a listing, which the visibility store may give a moment late)."""
    memo = await schedule_memo(client, pool_name)
    return memo is not None and memo.get(MEMO_TASK_QUEUE) == task_queue


async def unknown_pool(client: Client, task_queue: str, pool_name: str) -> str | None:
    """Why a command naming the pool is refused (no such pool here, naming those there
    are), or None when this controlplane reconciles it."""
    if await has_pool(client, task_queue, pool_name):
        return None
    return no_such_pool(pool_name, await pool_names(client, task_queue))


async def pool_runtimes(client: Client, task_queue: str, pool_name: str) -> tuple[str, ...] | None:
    """The runtimes a task of the pool may name (its schedule's memo), None when this
    controlplane reconciles no such pool."""
    memo = await schedule_memo(client, pool_name)
    if memo is None or memo.get(MEMO_TASK_QUEUE) != task_queue:
        return None
    offered = memo.get(MEMO_RUNTIMES)
    if not isinstance(offered, list) or not offered:
        return (DEFAULT_RUNTIME,)
    return tuple(str(name) for name in offered)


def runtime_not_offered(pool_name: str, runtime: str, offered: Sequence[str]) -> str | None:
    """Why a task of the pool may not name `runtime` ("": the pool's own), or None."""
    if not runtime or runtime in offered:
        return None
    return (
        f"pool {pool_name} does not offer runtime {runtime}: it offers {', '.join(offered)}"
        f" (config.worker.pools.{pool_name}.runtimes lists what its tasks may name)"
    )


def no_such_pool(pool_name: str, pools: Iterable[str]) -> str:
    return (
        f"no pool {pool_name} on this controlplane (`levers9 pool list` shows"
        f" {', '.join(sorted(pools)) or 'none'}): --pool names one"
    )


async def ensure_reconcile_schedule(
    client: Client,
    pool_name: str,
    settings: ControlplaneSettings,
    source: str = JOINED,
    *,
    simulated_gpus: bool = False,
    runtimes: Sequence[str] = (DEFAULT_RUNTIME,),
) -> bool:
    """Creates `reconcile:<pool>` (True), or updates it keeping an operator's pause (False).
    `source` (values or joined) and `simulated_gpus` are kept in its memo; a schedule whose memo
    says otherwise (or was made before the memo said) is made again with it, its pause kept."""
    schedule_id = reconcile_schedule_id(pool_name)
    schedule = reconcile_schedule(pool_name, settings)
    memo = {
        MEMO_TASK_QUEUE: settings.task_queue,
        MEMO_SOURCE: source,
        MEMO_SIMULATED_GPUS: simulated_gpus,
        MEMO_RUNTIMES: list(runtimes),
    }
    try:
        await client.create_schedule(schedule_id, schedule, memo=memo)
        return True
    except ScheduleAlreadyRunningError:
        handle = client.get_schedule_handle(schedule_id)
        described = await handle.describe()
        kept = await described.memo()
        if (
            kept.get(MEMO_SOURCE),
            kept.get(MEMO_SIMULATED_GPUS, False),
            kept.get(MEMO_RUNTIMES, [DEFAULT_RUNTIME]),
        ) != (source, simulated_gpus, list(runtimes)):
            # A schedule's memo cannot be updated: make it again, as it stood.
            await handle.delete()
            state = described.schedule.state
            await client.create_schedule(
                schedule_id, dataclasses.replace(schedule, state=state), memo=memo
            )
            return False

        def _update(current: ScheduleUpdateInput, new: Schedule = schedule) -> ScheduleUpdate:
            return ScheduleUpdate(
                dataclasses.replace(new, state=current.description.schedule.state)
            )

        await handle.update(_update)
        return False


async def schedule_source(client: Client, pool_name: str) -> str | None:
    """Who made pool `pool_name`'s schedule (values or joined); None when it has none, or was
    made before the memo said."""
    source = (await schedule_memo(client, pool_name) or {}).get(MEMO_SOURCE)
    return source if isinstance(source, str) else None


async def gpus_simulated(client: Client, pool_name: str) -> bool:
    """Whether pool `pool_name`'s values say `simulatedGpus: true` (its schedule's memo); False
    for a pool without a schedule, a joined one, or one scheduled before the memo said."""
    return (await schedule_memo(client, pool_name) or {}).get(MEMO_SIMULATED_GPUS) is True


async def schedule_memo(client: Client, pool_name: str) -> Mapping[str, Any] | None:
    """The memo of pool `pool_name`'s `reconcile:<pool>` schedule, described (read at once,
    unlike a listing); None when the pool has no schedule."""
    described = await or_none(
        client.get_schedule_handle(reconcile_schedule_id(pool_name)).describe()
    )
    return None if described is None else await described.memo()


async def sync_reconcile_schedules(
    client: Client,
    pool_names: Iterable[str],
    settings: ControlplaneSettings,
    keep: Iterable[str] = (),
    joined: Iterable[str] = (),
    simulated_gpus: Iterable[str] = (),
    runtimes: Mapping[str, Sequence[str]] | None = None,
) -> ScheduleSync:
    """Creates or updates `reconcile:<pool>` per pool; deletes those of pools no longer here.

    Pools in `keep` (in the values but not loadable, say a typo) keep their schedule as it is:
    a bad edit must not read as "pool removed". Pools in `joined` were made by `levers9
    cluster join`, the others by the values (the schedule's memo says which); pools in
    `simulated_gpus` say `simulatedGpus: true` (memo too), and `runtimes` holds the runtimes
    each pool's tasks may name (memo; a pool not in it: the default's). Only schedules
    that this controlplane's task queue owns (a memo) are deleted, so two controlplanes sharing
    a namespace leave each other alone. An operator's pause survives an update.
    """
    wanted = {reconcile_schedule_id(name): name for name in pool_names}
    kept = {reconcile_schedule_id(name) for name in keep}
    created, updated = [], []
    joined, simulated = set(joined), set(simulated_gpus)
    for schedule_id, pool_name in wanted.items():
        source = JOINED if pool_name in joined else VALUES
        if await ensure_reconcile_schedule(
            client,
            pool_name,
            settings,
            source,
            simulated_gpus=pool_name in simulated,
            runtimes=(runtimes or {}).get(pool_name, (DEFAULT_RUNTIME,)),
        ):
            created.append(schedule_id)
        else:
            updated.append(schedule_id)
    deleted = []
    for schedule_id in sorted(await _managed_schedule_ids(client, settings.task_queue)):
        if schedule_id not in wanted and schedule_id not in kept:
            await delivered(client.get_schedule_handle(schedule_id).delete())  # gone is done
            deleted.append(schedule_id)
    for schedule_id in deleted:
        log.info("deleted schedule of removed pool", schedule_id=schedule_id)
    return ScheduleSync(created=created, updated=updated, deleted=deleted)


class PoolScheduleRow(BaseModel):
    """One `reconcile:<pool>` schedule as `levers9 pool list` shows it."""

    pool: str
    schedule: str
    every: str
    paused: bool
    passes: int
    last_pass: datetime | None
    next_pass: datetime | None


async def list_reconcile_schedules(settings: ControlplaneSettings) -> list[PoolScheduleRow]:
    """Describes every reconcile schedule this controlplane's task queue owns."""
    return await describe_reconcile_schedules(await connect(settings), settings.task_queue)


async def wait_for_passes(
    settings: ControlplaneSettings,
    passes: int,
    within: float,
    progress: Callable[[int], None],
) -> list[PoolScheduleRow]:
    """Waits (one client, bounded) until every reconcile schedule has run `passes` times."""
    client = await connect(settings)
    async with asyncio.timeout(within):
        while True:
            rows = await describe_reconcile_schedules(client, settings.task_queue)
            done = min((row.passes for row in rows), default=0)
            progress(done)
            if rows and done >= passes:
                return rows
            await asyncio.sleep(PASS_POLL_S)


async def describe_reconcile_schedules(client: Client, task_queue: str) -> list[PoolScheduleRow]:
    """Every reconcile schedule of the controlplane of `task_queue`, described, by pool."""
    rows = []
    for schedule_id in sorted(await _managed_schedule_ids(client, task_queue)):
        described = await client.get_schedule_handle(schedule_id).describe()
        info, schedule = described.info, described.schedule
        every = ", ".join(f"{i.every.total_seconds():g}s" for i in schedule.spec.intervals)
        rows.append(
            PoolScheduleRow(
                pool=schedule_id.removeprefix(RECONCILE_PREFIX),
                schedule=schedule_id,
                every=every,
                paused=schedule.state.paused,
                passes=info.num_actions,
                last_pass=_seconds(info.recent_actions[-1].started_at)
                if info.recent_actions
                else None,
                next_pass=_seconds(info.next_action_times[0]) if info.next_action_times else None,
            )
        )
    return rows


def _seconds(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)
