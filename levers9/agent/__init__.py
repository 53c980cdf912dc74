"""The levers9 worker agent: the `levers9-worker` command of the worker Job.

It runs on one GPU node (privileged, usually on the host network), takes the cards the kubelet
gave its pod, serves `WorkerService` to the controlplane and dials the gateway to register,
heartbeat and report tasks. It is its own program: of `levers9` it imports only the wire
(`proto`, `rpc`, `tunnel`) and the shared core it reads (`contract`, `logs`, `process`,
`errors`, `certificates`, `image_reference`), never the controlplane (.importlinter's `agent`
contract, an allow-list). Modules, one responsibility each:

- `settings`: the environment contract (what the worker Job sets);
- `paths`: node paths → where they really are (itself on a node; mapped in the sandbox);
- `driver`: registers the host driver libraries with the loader;
- `smi`: the few `nvidia-smi` queries the agent needs;
- `checkpoint`: the kubelet's device-plugin checkpoint; `devices`: this worker's cards;
- `output`: a task's captured output; `runtime` (+ `process_runtime`, `runc_runtime`): what
  runs a task; `runtimes`: the registry the pool's `runtime` setting names one of;
- runc's parts: `runc_config` (a task's OCI config), `runc_container` (one container, its shim
  and record), `cgroups` (a container's cgroups: OOM kills, removal);
- `supervisor`: the tasks, their cards, start and end (+ `task_record`: a task's record and its
  copy on disk; `task_ports`: its published ports and readiness; `task_errors`: what the calls
  refuse with); `auth`, `service`, `server`: WorkerService;
- `backoff`, `gateway`: the gateway client; `agent`: the wiring; `main`: the command.
"""
