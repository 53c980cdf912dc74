"""`levers9-worker`: the worker Job's command. Configured by the environment only (see
`settings`); exits 0 after a clean shutdown (SIGTERM), 1 when it cannot start."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping

from levers9 import logs
from levers9.agent.agent import Agent, StartupError
from levers9.agent.paths import HostPaths, HostPathsError
from levers9.agent.settings import SettingsError, WorkerSettings
from levers9.process import exit_now

log = logs.get_logger("levers9.agent")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def main() -> None:
    exit_now(run(os.environ))


def run(env: Mapping[str, str]) -> int:
    level = (env.get("LEVERS9_LOG_LEVEL") or "INFO").upper()
    logs.setup(level if level in LEVELS else "INFO")
    try:
        paths = HostPaths.from_env(env)
        settings = WorkerSettings.from_env(env, paths)
        credentials = settings.gateway_credentials()
    except (SettingsError, HostPathsError) as error:
        log.error("worker cannot start", error=str(error))
        return 1
    return asyncio.run(_serve(Agent(settings, paths, env, gateway_credentials=credentials)))


async def _serve(agent: Agent) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.run(stop)
    except StartupError as error:
        log.error("worker cannot start", error=str(error))
        return 1
    return 0


if __name__ == "__main__":
    main()
