"""One SDK scenario, in both modes Gatehouse runs in.

Production: Postgres, Redis (broker and stream events), the production web
server (gunicorn with uvicorn workers) and two worker processes. Embedded:
what `make run` starts (`manage.py run_embedded`), with no DATABASE_URL and
no broker URL: SQLite, the filesystem broker, stream events in the database,
the same web server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from langgraph_sdk import get_sync_client

from tests.deployment.processes import free_port, shell_env
from tests.factories import make_api_key, make_tenant
from tests.servers import LiveServer
from tests.workers import ROOT, Worker, wait_for

pytestmark = pytest.mark.worker

HELLO = {"messages": [{"role": "user", "content": "hi"}]}
SCENARIO_AGENTS = "chat@1=tests.agents:chat_graph,echo@1=tests.agents:echo_graph"


def scenario(client) -> None:
    """Threads, an input interrupt, a streamed resume rejoined mid-way, join,
    state, history and deletion, as a LangGraph client uses them."""
    assert "chat" in {a["graph_id"] for a in client.assistants.search(limit=50)}
    thread_id = client.threads.create(metadata={"graph_id": "chat"})["thread_id"]
    waited = client.runs.wait(thread_id, "chat", input=HELLO)
    assert waited["__interrupt__"][0]["value"] == {"question": "What is your name?"}
    assert client.threads.get(thread_id)["status"] == "interrupted"
    seen, run_id = [], None
    stream = client.runs.stream(
        thread_id,
        "chat",
        command={"resume": "Ada"},
        stream_mode=["values", "messages-tuple"],
    )
    for part in stream:
        seen.append(part)
        run_id = run_id or part.data["run_id"]
        if sum(p.event == "messages" for p in seen) == 3:
            break
    stream.close()
    rest = list(client.runs.join_stream(thread_id, run_id, last_event_id=seen[-1].id))
    tokens = [p.data[0]["content"] for p in seen + rest if p.event == "messages"]
    assert "".join(tokens) == "Hello Ada, nice to meet you."
    assert rest[-1].event == "end"
    assert client.runs.join(thread_id, run_id)["name"] == "Ada"
    assert client.runs.get(thread_id, run_id)["status"] == "success"
    assert client.threads.get_state(thread_id)["values"]["name"] == "Ada"
    assert len(client.threads.get_history(thread_id, limit=50)) >= 3
    client.threads.delete(thread_id)
    with pytest.raises(httpx.HTTPStatusError):
        client.threads.get(thread_id)


def test_the_scenario_in_production_mode(transactional_db, worker):
    """Postgres, Redis, gunicorn+uvicorn, and two worker processes."""
    second = Worker(name="second")
    server = LiveServer(name="production")
    try:
        tenant = make_tenant()
        _, secret = make_api_key(tenant)
        client = get_sync_client(url=f"{server.url}/langgraph", api_key=secret)
        scenario(client)
        client.http.client.close()
    finally:
        server.stop()
        second.stop()


def _demo_key(var_dir: Path) -> str:
    lines = (var_dir / "demo.env").read_text().splitlines()
    return next(
        line.split("=", 1)[1] for line in lines if line.startswith("GATEHOUSE_API_KEY=")
    )


def test_the_scenario_in_the_embedded_mode(tmp_path):
    """`make run` (`manage.py run_embedded`) from an operator's shell: no
    database or broker URL, nothing but where var/ is and the agents."""
    env = shell_env(GATEHOUSE_VAR_DIR=str(tmp_path), GATEHOUSE_AGENTS=SCENARIO_AGENTS)
    port = free_port()
    log = (tmp_path / "embedded.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_embedded", "--bind", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(answers, timeout=120, what="the embedded server to start")
        client = get_sync_client(url=f"{url}/langgraph", api_key=_demo_key(tmp_path))
        scenario(client)
        client.http.client.close()
    finally:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=30)
        log.close()
