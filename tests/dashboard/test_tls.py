"""The dashboard under TLS, through the endpoints' front as the controlplane serves it (its
`/ui/` on an `EndpointProxy` with the gateway's certificate), in Chromium: the session cookie is
`Secure` there, as well as HttpOnly and SameSite=Strict. The gateway's real TasksService and
Authority answer; the task records are an empty in-memory page (no Temporal needed here)."""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from playwright.async_api import async_playwright, expect
from pydantic import SecretStr

from levers9.certificates import ca_certificate, serving_certificate
from levers9.dashboard.app import Dashboard
from levers9.dashboard.calls import Services
from levers9.gateway.endpoint_proxy import EndpointProxy
from levers9.gateway.endpoint_views import EndpointBook
from levers9.gateway.task_records import TaskRecords
from levers9.gateway.task_service import TasksService
from levers9.models import TaskRecord
from levers9.tokens import operator_token
from tests.dashboard.test_dashboard import CHROMIUM, HAS_CHROMIUM

SECRET = "dashboard-tls-test-secret-" + "x" * 16


class NoTasks:
    async def page(
        self, pool_name: str | None, page_size: int, page_token: bytes, workspace: str | None = None
    ) -> tuple[list[TaskRecord], bytes]:
        return [], b""


def _tls(directory: Path) -> ssl.SSLContext:
    now = dt.datetime.now(dt.UTC)
    later = now + dt.timedelta(days=1)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = ca_certificate(ca_key, "dashboard test CA", 1, now, later)
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    cert = serving_certificate(ca_key, ca, key.public_key(), names, now, later)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[str]:
    tasks = TasksService(cast(TaskRecords, NoTasks()), SecretStr(SECRET))
    dashboard = Dashboard(Services(tasks, None, None, None), SecretStr(SECRET))
    proxy = EndpointProxy(
        cast(EndpointBook, None), tasks, SecretStr(SECRET), "tls-test", ui=dashboard.handle
    )
    port = await proxy.start("127.0.0.1:0", _tls(tmp_path))
    try:
        yield f"https://localhost:{port}/ui/"
    finally:
        await proxy.stop()


async def test_the_session_cookie_is_secure_under_tls(front: str) -> None:
    if not HAS_CHROMIUM:
        pytest.fail("no /usr/bin/chromium: apt-get install chromium (.ci/run installs it)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = await browser.new_context(ignore_https_errors=True)
            page = await context.new_page()
            await page.goto(front + "sign-in")
            await page.get_by_test_id("token").fill(operator_token(SECRET))
            await page.get_by_test_id("sign-in").click()
            await expect(page).to_have_url(front + "tasks")
            await expect(page.get_by_test_id("who")).to_have_text("operator")
            await expect(page.get_by_test_id("tasks-empty")).to_have_text("No task matches.")
            cookies = {c["name"]: c for c in await context.cookies()}
            session = cookies["l9_session"]
            assert session["secure"] is True
            assert session["httpOnly"] is True
            assert session["sameSite"] == "Strict"
            assert cookies["l9_csrf"]["secure"] is True
        finally:
            await browser.close()
