"""The gateway: the controlplane's gRPC endpoint that workers dial (register, heartbeat, results).

    records = TemporalWorkerRecords(client)
    gateway = Gateway(records, settings.token_secret(), heartbeat_seconds=10)
    port = await gateway.start(settings.gateway_listen)
    ...
    await gateway.stop(grace=5)

Modules: `server` (`Gateway`), `service` (the `levers9.v1.Gateway` servicer), `auth` (worker
tokens from call metadata), `convert` (requests checked and turned into records), `records` (the
Temporal signals), `reports` (`TaskReport`, pure).

Deliberately imports nothing: `reports` is pure and may be imported where grpc is unwelcome.
"""
