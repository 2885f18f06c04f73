"""The production web server: gunicorn with uvicorn workers serving
config.asgi, configured as the production docs say, against the test
database, behind a TLS proxy (X-Forwarded-Proto, which uvicorn believes from
127.0.0.1). The admin, the API and a streaming export go through it."""

from __future__ import annotations

import csv
import http.client
import io
import re
import signal
import socket
import subprocess
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from tests import workers
from tests.audit.helpers import add_events
from tests.deployment.processes import (
    ROOT,
    free_port,
    gunicorn_command,
    manage,
    production_env,
)
from tests.factories import make_api_key, make_member, make_tenant
from tests.workers import wait_for

pytestmark = [pytest.mark.server, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct horse battery staple"
HTTPS = {"X-Forwarded-Proto": "https"}


class Server:
    def __init__(self, port: int, log_path) -> None:
        self.port = port
        self.log_path = log_path

    def request(self, method, path, *, headers=None, body=None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.headers, response.read()
        finally:
            connection.close()

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory):
    folder = tmp_path_factory.mktemp("production")
    env = production_env(
        DATABASE_URL=workers.suite_database_url(),
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        STATIC_ROOT=str(folder / "static"),
    )
    collected = manage("collectstatic", "--noinput", env=env)
    assert collected.returncode == 0, collected.stderr
    port = free_port()
    log_path = folder / "gunicorn.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            gunicorn_command(port),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(port, log_path)

    def answers() -> bool:
        try:
            return server.request("GET", "/healthz")[0] == 200
        except OSError:
            return process.poll() is not None

    wait_for(answers, timeout=60, what="gunicorn to answer /healthz")
    assert process.poll() is None, server.log()
    yield server
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


def test_api_answers_through_the_asgi_server(server):
    _, secret = make_api_key(make_tenant())
    status, headers, body = server.request(
        "GET", "/api/v1/agents", headers={**HTTPS, "Authorization": f"Bearer {secret}"}
    )
    assert status == 200 and b'"refund"' in body
    assert headers["server"] == "uvicorn"
    assert headers["Strict-Transport-Security"].startswith("max-age=31536000")
    assert "script-src 'self'" in headers["Content-Security-Policy"]


def test_plain_http_is_redirected_to_https_but_probes_are_not(server):
    status, headers, _ = server.request("GET", "/api/v1/agents")
    assert status == 301
    assert headers["Location"] == f"https://127.0.0.1:{server.port}/api/v1/agents"
    assert server.request("GET", "/healthz")[0] == 200
    status, _, body = server.request("GET", "/readyz")
    assert status == 200 and b'"warnings":[]' in body


def test_admin_login_over_the_server_sets_a_secure_short_session(server):
    user = make_member(make_tenant(), username="rita").user
    # A hash production's hashers can check (the suite's own is MD5, for speed).
    user.password = PBKDF2PasswordHasher().encode(PASSWORD, "pepper", iterations=1000)
    user.save(update_fields=["password"])
    status, headers, page = server.request("GET", "/admin/login/", headers=HTTPS)
    assert status == 200
    csrf = SimpleCookie(headers["Set-Cookie"])["csrftoken"]
    assert csrf["secure"] is True
    # The stylesheet under its hashed name, from collectstatic's manifest.
    stylesheet = re.search(rb'href="(/static/admin/css/base\.[0-9a-f]+\.css)"', page)
    assert server.request("GET", stylesheet[1].decode(), headers=HTTPS)[0] == 200

    form = {
        "csrfmiddlewaretoken": csrf.value,
        "username": "rita",
        "password": PASSWORD,
        "next": "/admin/",
    }
    status, headers, _ = server.request(
        "POST",
        "/admin/login/",
        headers={
            **HTTPS,
            "Origin": f"https://127.0.0.1:{server.port}",
            "Cookie": f"csrftoken={csrf.value}",
            "Content-Type": "application/x-www-form-urlencoded",
        },
        body=urlencode(form),
    )
    assert status == 302 and headers["Location"] == "/admin/"
    session = next(
        cookie["sessionid"]
        for cookie in map(SimpleCookie, headers.get_all("Set-Cookie"))
        if "sessionid" in cookie
    )
    assert session["secure"] is True and session["httponly"] is True
    assert session["samesite"] == "Lax" and int(session["max-age"]) == 8 * 3600
    status, _, page = server.request(
        "GET", "/admin/", headers={**HTTPS, "Cookie": f"sessionid={session.value}"}
    )
    assert status == 200 and b"Site administration" in page


def test_audit_export_streams_through_the_server(server):
    """(That it streams block by block rather than buffered is shown in
    tests/audit/test_export.py; here, that the ASGI server serves it whole.)"""
    tenant = make_tenant()
    _, secret = make_api_key(tenant, ["audit"])
    seqs = add_events(tenant, 2000)  # several 64 kB blocks of CSV
    status, headers, body = server.request(
        "GET",
        "/api/v1/audit/events?format=csv",
        headers={**HTTPS, "Authorization": f"Bearer {secret}"},
    )
    assert status == 200 and headers["Transfer-Encoding"] == "chunked"
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert [int(row["seq"]) for row in rows] == list(range(1, seqs[-1] + 1))


def _raw_exchange(server, request: bytes) -> list[int]:
    """The statuses of every response the server sends to `request` written
    as is on one connection, until it closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", received)]


# Closes the connection after its answer, so the exchange ends.
HIDDEN = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "framing",
    [
        # Content-Length and chunked together: a proxy that believes one and a
        # server that believes the other disagree on where the request ends.
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        # Two lengths that disagree.
        b"Content-Length: 0\r\nContent-Length: 5\r\n\r\n",
        # A transfer coding that is not chunked, beside a length.
        b"Transfer-Encoding: xchunked\r\nContent-Length: 0\r\n\r\n",
    ],
    ids=["length-and-chunked", "two-lengths", "unknown-coding"],
)
def test_ambiguous_request_framing_is_refused_and_nothing_is_smuggled(server, framing):
    """Request smuggling through the HTTP parser (httptools): a request whose
    end is ambiguous gets a 400 and the connection is closed, so the request
    behind it is never answered."""
    post = b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    assert _raw_exchange(server, post + framing + HIDDEN) == [400]
    # The control: with honest framing, the request behind is answered.
    honest = b"Content-Length: 0\r\n\r\n"
    assert _raw_exchange(server, post + honest + HIDDEN) == [405, 200]
