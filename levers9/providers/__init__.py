"""Providers: where a pool's GPU nodes come from. Every pool is `provider: kubernetes` of one
`kubernetes.flavor`; what differs between them is here, one module each:

- `flavors`: the registry of flavors (`gke`, `generic`): how each one's credentials are checked,
  whether it needs the cluster's CA, whether its GPU nodes are tainted (pure; config imports it);
- `gke`: the cloud side of a GKE pool as data (authorized networks, firewall, registry, egress,
  the values block `levers9 gke attach` prints), kept true by the attach workflow;
- `joined`: a cluster joined with `levers9 cluster join` (what the join installs, the
  `generic`, tunnel-mode pool it makes), the same for every Kubernetes.

Pure: no I/O, no clients (the API clients are built in activities/kube_clients.py, the cloud's
calls made in activities/gcp.py). docs/architecture.md lists what a new provider touches.
"""
