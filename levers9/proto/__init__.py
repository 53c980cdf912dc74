"""gRPC contracts: WorkerService (the agent) and Gateway (the controlplane)."""
