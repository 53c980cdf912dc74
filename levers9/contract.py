"""What the controlplane's worker Job and the agent inside it agree on: Kubernetes names and node
paths. The agent (`levers9.agent`) imports nothing else of the controlplane (.importlinter), so
both sides read these from here."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

GPU = "nvidia.com/gpu"
"""The extended resource of NVIDIA cards (the device plugin's)."""
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
"""The kubelet's device-plugin directory: the Job mounts it read-only, the agent reads the
checkpoint in it to learn which cards the kubelet gave its pod."""
NVIDIA_MAJOR = 195
"""The character major of NVIDIA's device nodes: `/dev/nvidiaN` is 195:N, `/dev/nvidiactl`
195:255 (the sandbox's kubelet makes them so, the runc runtime passes them to containers)."""
NVIDIACTL_MINOR = 255
CREDENTIALS_DIR = "/var/run/levers9/worker"
"""Where the worker Job mounts its token Secret (files of mode 0400: `token`, `tls.crt`,
`tls.key`): the agent reads its credentials there, never from its environment, so no process
of the node (a task's least of all) finds them in an environment."""
TOKEN_FILE = "token"
COMMAND_DIGEST_FILE = "command-token.sha256"
"""The SHA-256 of the token the controlplane presents to this worker (not the token)."""
COMMAND_TOKEN_HEADER = "levers9-command-token"
"""The call metadata carrying the controlplane's command token to WorkerService."""
PORT_CONNECTED_HEADER = "levers9-port-connected"
"""Initial metadata of `WorkerService/PortForward` once the worker has connected to the task's
port (and passed on by a gateway that relays the stream): a stream that fails without it never
delivered a byte to the task, so what it carried can go to another replica."""
WORK_ROOT = "/var/lib/levers9/work"
"""The node path under which each agent keeps its work dir (`<worker-id>/`) unless
`LEVERS9_WORK_DIR` names one: tasks' output and results, the runc root (`runc/`), a record per
container (`containers/`) and the agent's own pid (`agent.json`). An agent started again for the
same worker adopts what is there; `levers9 dev down` finds what a killed agent left."""
AGENT_FILE = "agent.json"
"""In the work dir: the agent's pid and start time (in clock ticks, /proc/<pid>/stat's 22nd)."""
TLS_CERT_FILE = "tls.crt"
TLS_KEY_FILE = "tls.key"

CHECKPOINT_STORE_FOLDER = "checkpoints"
"""Under a checkpoint volume's prefix: one folder per checkpoint image (`<name>/image.tar`,
`image.tar.sha256`): the agent uploads them there, the controlplane removes them (box delete)."""
RUNTIMES = ("process", "runc", "runsc")
"""The pool's `runtime` setting: how the agent runs its tasks (`levers9.agent.runtimes` holds
one factory per name; the Job passes the pool's choice as `LEVERS9_RUNTIME`, and the others it
offers as `LEVERS9_RUNTIMES`)."""
DEFAULT_RUNTIME = "runc"
TASK_RUNTIMES = ("runc", "runsc")
"""What a pool may set (`runtime`, `runtimes`) and a task ask for (`levers9 run --runtime`,
where its pool offers it). Not `process`: it runs tasks outside any sandbox, so it is the agent's
own tests' runtime (`LEVERS9_RUNTIME=process` on an agent they start), never a pool's."""


def runtime_problem(name: str) -> str | None:
    """What is wrong with `name` as a pool's `runtime`, or None when it is one of RUNTIMES."""
    if name in RUNTIMES:
        return None
    return f"unknown runtime {name!r:.40}: use one of {', '.join(RUNTIMES)}"


def pool_runtime_problem(name: str) -> str | None:
    """What is wrong with `name` as a pool's `runtime` (or one of its `runtimes`), or None."""
    if name == "process":
        return (
            "process runs tasks as processes of the worker, outside any sandbox: it is the"
            " agent's own tests' runtime, never a pool's; use runc or runsc"
        )
    return task_runtime_problem(name) if name else "unknown runtime '': use one of runc, runsc"


def task_runtime_problem(name: str) -> str | None:
    """What is wrong with `name` as the runtime a task asks for ("" asks for none: the pool's),
    or None."""
    if not name or name in TASK_RUNTIMES:
        return None
    return f"unknown runtime {name!r:.40}: use one of {', '.join(TASK_RUNTIMES)}"


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""An RFC 1123 label, as Kubernetes names are: pool names and worker ids become parts of object
names and labels. Use with `fullmatch` (a `$` would let a trailing newline through)."""


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_FORM = "at most 63 of A-Z, a-z, 0-9, '-', '_', '.', starting and ending alphanumeric"


def label_problem(key: str, value: str) -> str | None:
    """What Kubernetes would refuse in the label (or node selector term) `key=value`, naming
    the part; None when it takes it. A key is `[prefix/]name`: the prefix a DNS subdomain of
    at most 253; the name, and the value unless empty, at most 63 of `[A-Za-z0-9._-]`,
    starting and ending alphanumeric."""
    prefix, slash, name = key.rpartition("/")
    if not _LABEL_NAME.fullmatch(name):
        return f"label key {key!r}: its name {name!r} is not {_LABEL_FORM}"
    if slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        return (
            f"label key {key!r}: its prefix {prefix!r} is not a DNS subdomain (lowercase a-z,"
            " 0-9, '-' and '.', at most 253)"
        )
    if value and not _LABEL_NAME.fullmatch(value):
        return f"label {key}: its value {value!r} is not {_LABEL_FORM} (or empty)"
    return None


def registry_mirrors(text: str, setting: str = "LEVERS9_REGISTRY_MIRRORS") -> dict[str, str]:
    """`host=host:port,...`: where a registry host is served instead (the dev stack's Artifact
    Registry on loopback); a malformed entry names the setting and the form (ValueError)."""
    mirrors: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        host, sep, target = entry.partition("=")
        if not sep or not host or not target:
            raise ValueError(f"{setting} entry {entry!r} is not host=host:port")
        mirrors[host] = target
    return mirrors


def host_list(text: str) -> frozenset[str]:
    """`host:port,...` (the registries spoken to over plain HTTP)."""
    return frozenset(filter(None, (h.strip() for h in text.split(","))))


AGENT_NAME = "levers9-agent"
"""A joined cluster's agent (`levers9 cluster join`): its ServiceAccount, Role, Secret and
Deployment all bear this name."""
JOIN_TOKEN_KEY = "join-token"
"""The agent's Secret's key of the one-time join token."""
AGENT_TOKEN_KEY = "agent-token"
"""The agent's Secret's key of the agent's own token, written once the join token is spent."""
KUBE_TARGET = "kube"
"""The tunnel target of a joined cluster's agent: its proxy to the cluster's API."""

MAX_TASK_INPUT_BYTES = 128 * 1024
"""The most a task's command (its arguments) and environment may hold together, in UTF-8 bytes
(each argument and `KEY=VALUE` counted with a terminating NUL, as exec counts them): one limit
for `levers9 run` and `endpoint create`'s replicas, refused at submit. It keeps every record's
input far below Temporal's 2 MB payload limit (past 256 KiB Temporal warns, and a record that
large would fail at each continue-as-new)."""
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A variable name a shell can use (POSIX's portable names)."""


def task_input_bytes(command: Sequence[str], env: Mapping[str, str]) -> int:
    """What a task's command and environment hold, as MAX_TASK_INPUT_BYTES counts it."""
    args = sum(len(arg.encode("utf-8", "surrogatepass")) + 1 for arg in command)
    variables = sum(
        len(key.encode("utf-8", "surrogatepass")) + len(value.encode("utf-8", "surrogatepass")) + 2
        for key, value in env.items()
    )
    return args + variables


def task_input_problem(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why a task's command and environment cannot be taken (too large together, a variable
    name no shell can use, a NUL byte, which no exec can pass), naming the fix; None when they
    can. The controlplane refuses at submit; the agent refuses again what reaches it."""
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key):
            return (
                f"{key!r} is not a variable name: letters, digits and _, not starting with a digit"
            )
        if "\0" in value:
            return f"the value of {key} holds a NUL byte, which no process environment can"
    for index, arg in enumerate(command):
        if "\0" in arg:
            return f"argument {index} of the command holds a NUL byte, which no exec can pass"
    size = task_input_bytes(command, env)
    if size > MAX_TASK_INPUT_BYTES:
        return (
            f"the command and environment hold {size} bytes, more than {MAX_TASK_INPUT_BYTES}"
            " (128 KiB): pass large data in a file, a volume or the image"
        )
    return None


READY_PATH = re.compile(r"/[\x21-\x7e]*")
"""A ready path as a request line carries it: `/`, then printable ASCII without spaces."""


def ready_path_problem(path: str) -> str | None:
    """Why a replica's ready path cannot be probed (the agent writes it into `GET <path>`),
    naming the fix; None for "" (no path: the port accepting is ready) or a good path."""
    if not path or READY_PATH.fullmatch(path):
        return None
    if not path.startswith("/"):
        return f"{path!r} must start with /"
    return f"{path!r} must be printable ASCII without spaces (percent-encode the rest)"
