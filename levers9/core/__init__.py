"""The shared core: the pool's arithmetic, pure (no I/O, no clock, no Temporal, no Kubernetes
client), imported by the controlplane's workflows and activities, the gateway, the CLI and the
agent alike.

- `capacity`: what a node offers as a machine (GPUs, CPU, memory left by the other pods);
- `placement`: which worker runs a task, on which of its cards;
- `endpoints`: an endpoint's replicas and its autoscaler;
- `observation`: what changed since the previous reconcile pass, small enough for history;
- `manifests`: the worker Job and its token Secret as Kubernetes manifests;
- `quantity`: Kubernetes resource quantities, parsed exactly;
- `image_reference`: image references as Docker reads them.

It may import only `levers9.contract` (the names the agent and the worker Job agree on) and
itself (.importlinter's `core` contract). The pool's values schema and per-pool settings are the
other half of the shared core, in `levers9.config`.
"""
