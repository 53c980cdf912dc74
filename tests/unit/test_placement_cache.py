"""Cache locality (the pool's `cache.enabled`): a task goes to a fitting worker whose node's image
cache holds its image before any other, ties broken as without it (the tightest fit, then the
worker id); a worker that reports nothing, or a task without an image, is placed as ever.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from levers9.agent.settings import WorkerSettings
from levers9.core.manifests import worker_job
from levers9.core.placement import MAX_CACHED_IMAGES, PoolState, Slot, image_key
from levers9.gateway import convert
from levers9.gateway.errors import InvalidRequest
from levers9.proto import gateway_pb2
from tests.factories import worker_job_spec

T0 = datetime(2026, 9, 18, 10, 0, tzinfo=UTC)
RESERVE = timedelta(seconds=30)
TRAIN = "registry.example.com/ml/train:v1"


def _pool(**workers: tuple[tuple[int, ...], tuple[str, ...]]) -> PoolState:
    state = PoolState()
    for worker_id, (devices, images) in workers.items():
        state.add_worker(
            Slot(
                worker_id=worker_id,
                node_name=f"n-{worker_id}",
                address="127.0.20.1:1",
                devices=devices,
                images=tuple(image_key(i) for i in images),
            )
        )
    return state


def _placed_on(state: PoolState, task_id: str, image: str = TRAIN, gpus: int = 1) -> str:
    state.request(task_id, gpus, T0, image=image_key(image) if image else "")
    [placed] = state.assign(T0, RESERVE)
    return placed.worker_id


def test_the_worker_that_holds_the_image_goes_first() -> None:
    # Without the cache "a" would win the tie (same free cards, lower id).
    state = _pool(a=((0,), ()), b=((0,), (TRAIN,)))
    assert _placed_on(state, "t1") == "b"


def test_the_cache_beats_the_tightest_fit() -> None:
    state = _pool(tight=((0,), ()), roomy=((0, 1, 2, 3), (TRAIN,)))
    assert _placed_on(state, "t1") == "roomy"


def test_ties_among_holders_are_broken_as_today() -> None:
    state = _pool(a=((0, 1, 2, 3), (TRAIN,)), b=((0, 1), (TRAIN,)), c=((0,), ("other/image:1",)))
    assert _placed_on(state, "t1") == "b"  # the tightest of the two that hold it


def test_a_holder_without_room_is_passed_over() -> None:
    state = _pool(a=((0,), ()), b=((0,), (TRAIN,)))
    assert _placed_on(state, "first") == "b"
    assert _placed_on(state, "second") == "a"  # b is full: the next fit, as without the cache
    state.request("third", 1, T0, image=image_key(TRAIN))
    assert state.assign(T0, RESERVE) == []  # both busy: it waits
    state.release("first")
    [placed] = state.assign(T0, RESERVE)
    assert (placed.task_id, placed.worker_id) == ("third", "b")


def test_matching_is_on_the_reference_as_docker_reads_it() -> None:
    state = _pool(a=((0,), ()), b=((0,), ("docker.io/library/busybox:1.36",)))
    assert _placed_on(state, "t1", image="busybox:1.36") == "b"
    state = _pool(a=((0,), ()), b=((0,), ("docker.io/library/busybox:1.36",)))
    assert _placed_on(state, "t2", image="busybox:1.37") == "a"  # another tag is another image


def test_with_nothing_reported_placement_is_as_without_the_cache() -> None:
    state = _pool(a=((0,), ()), b=((0,), ()))
    assert _placed_on(state, "t1") == "a"


def test_a_worker_heard_again_keeps_its_ledger_and_takes_its_new_report() -> None:
    state = _pool(a=((0, 1), ()), b=((0, 1), ()))
    assert _placed_on(state, "t1") == "a"
    state.add_worker(
        Slot(
            worker_id="b",
            node_name="n-b",
            address="x:1",
            devices=(0, 1),
            images=(image_key(TRAIN),),
        )
    )
    assert _placed_on(state, "t2") == "b"
    assert state.slots["b"].busy == {"t2": (0,)}


def test_image_key_is_short_and_normalized() -> None:
    assert image_key("busybox") == image_key("docker.io/library/busybox")
    assert len(image_key(TRAIN)) == 16
    assert image_key("Not A Reference") == ""


def test_the_gateway_keys_a_heartbeats_report_and_bounds_it() -> None:
    unchanged = gateway_pb2.HeartbeatRequest(pool_name="p", worker_id="w-1", running_tasks=0)
    assert convert.heartbeat(unchanged).images is None
    reported = gateway_pb2.HeartbeatRequest(
        pool_name="p",
        worker_id="w-1",
        cached_images=["busybox", "docker.io/library/busybox", TRAIN],
        cache_reported=True,
    )
    assert convert.heartbeat(reported).images == (image_key("busybox"), image_key(TRAIN))
    empty = gateway_pb2.HeartbeatRequest(pool_name="p", worker_id="w-1", cache_reported=True)
    assert convert.heartbeat(empty).images == ()
    too_many = gateway_pb2.HeartbeatRequest(
        pool_name="p",
        worker_id="w-1",
        cached_images=[f"r/i:{n}" for n in range(MAX_CACHED_IMAGES + 1)],
        cache_reported=True,
    )
    with pytest.raises(InvalidRequest, match="cached_images"):
        convert.heartbeat(too_many)
    bad = gateway_pb2.HeartbeatRequest(
        pool_name="p", worker_id="w-1", cached_images=["NOT VALID"], cache_reported=True
    )
    with pytest.raises(InvalidRequest, match=r"cached_images\[0\]"):
        convert.heartbeat(bad)


def _settings(**overrides: object) -> WorkerSettings:
    [container] = worker_job(worker_job_spec(**overrides))["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.pop("LEVERS9_CREDENTIALS_DIR")  # the token's files are the Secret's, not here
    env["LEVERS9_WORKER_TOKEN"] = "l9w1.t"
    return WorkerSettings.from_env(env)


def test_the_pools_cache_setting_reaches_the_agent() -> None:
    assert _settings(image_cache_report=True).image_cache_report
    assert not _settings().image_cache_report, "off unless the pool's cache.enabled"


def test_the_pools_state_stays_small() -> None:
    """The state is PoolWorkflow's continue-as-new payload (Temporal's limit: 2 MB): a task
    without an image costs nothing, a standing queue of 10,000 with one stays under it, and
    what workers report is bounded."""
    plain, cached = PoolState(), PoolState()
    for n in range(10_000):
        plain.request(f"t{n:08d}", 1, T0)
        cached.request(f"t{n:08d}", 1, T0, image=image_key(f"r/i:{n}"))
    assert '"image"' not in plain.model_dump_json()
    assert len(cached.model_dump_json()) < 1_900_000
    again = PoolState.model_validate_json(cached.model_dump_json())
    assert again.waiting[7].image == image_key("r/i:7")
    assert PoolState.model_validate_json(plain.model_dump_json()).waiting[7].image == ""
    workers = _pool(
        **{
            f"w{n:04d}": ((0, 1, 2, 3), tuple(f"r/i:{n}-{i}" for i in range(64)))
            for n in range(500)
        }
    )
    assert len(workers.model_dump_json()) < 750_000  # 500 workers, 64 images each
