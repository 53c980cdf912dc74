"""The web dashboard at `/ui/` of each controlplane replica's endpoints front
(`levers9.dashboard.app.Dashboard`): server-rendered pages over the gateway's own services, with
the signed-in user's token (docs/dashboard.md)."""
