"""The sandbox: a local, simulated GKE cluster and cloud for `levers9 dev`, tests and benchmarks."""
