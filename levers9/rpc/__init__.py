"""gRPC pieces both servers share (the gateway, a worker's WorkerService)."""
