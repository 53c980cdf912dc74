"""What the Deployment, ReplicaSet and Job controllers do alike to the objects they own: find
them (the owner's selector, then its controller reference), and create and delete pods with
the Events kube-controller-manager records on the owner."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox import errors
from sandbox.cluster.events import EventRecorder
from sandbox.cluster.objects import Obj, controller_uid, meta, name_of, uid_of
from sandbox.options import DeleteOptions
from sandbox.resources import PODS, Resource
from sandbox.selectors import LabelSelector

if TYPE_CHECKING:
    from sandbox.registry import Registry


def owned(registry: Registry, resource: Resource, owner: Obj) -> list[Obj]:
    """The `resource` objects in the owner's namespace that its selector matches and it
    controls."""
    selector = LabelSelector.from_object((owner.get("spec") or {}).get("selector"))
    page = registry.list(resource, meta(owner)["namespace"], label_selector=selector)
    uid = uid_of(owner)
    return [obj for obj in page.items() if controller_uid(obj) == uid]


def owners_named(obj: Obj, kind: str) -> list[str]:
    """The names in `obj`'s controller references to a `kind` (its Job, its ReplicaSet)."""
    return [
        str(ref.get("name"))
        for ref in meta(obj).get("ownerReferences") or ()
        if ref.get("controller") and ref.get("kind") == kind
    ]


def create_pod(registry: Registry, events: EventRecorder, owner: Obj, pod: Obj) -> Obj:
    """Creates `pod` in the owner's namespace; a refusal (e.g. admission's 403 for a missing
    service account) is recorded as FailedCreate and raised, for the controller's back-off."""
    try:
        created = registry.create(PODS, pod, namespace=meta(owner)["namespace"])
    except errors.ApiError as error:
        events.warning(owner, "FailedCreate", f"Error creating: {error.message}")
        raise
    events.normal(owner, "SuccessfulCreate", f"Created pod: {name_of(created)}")
    return created


def delete_pod(registry: Registry, events: EventRecorder, owner: Obj, pod: Obj) -> None:
    """Deletes this pod (this uid); one already gone or replaced (404, 409) is left alone."""
    try:
        registry.delete(
            PODS, meta(pod)["namespace"], name_of(pod), DeleteOptions(precondition_uid=uid_of(pod))
        )
    except errors.ApiError as error:
        if error.code not in (404, 409):
            raise
        return
    events.normal(owner, "SuccessfulDelete", f"Deleted pod: {name_of(pod)}")
