"""What the controlplane's worker Job and the agent inside it agree on: Kubernetes names and node
paths. The agent (`levers9.worker`) imports nothing else of the controlplane (.importlinter), so
both sides read these from here."""

from __future__ import annotations

import re

GPU = "nvidia.com/gpu"
"""The extended resource of NVIDIA cards (the device plugin's)."""
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
"""The kubelet's device-plugin directory: the Job mounts it read-only, the agent reads the
checkpoint in it to learn which cards the kubelet gave its pod."""
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""An RFC 1123 label, as Kubernetes names are: pool names and worker ids become parts of object
names and labels. Use with `fullmatch` (a `$` would let a trailing newline through)."""
