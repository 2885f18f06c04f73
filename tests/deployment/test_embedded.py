"""The embedded mode as a newcomer meets it: `make run` in a checkout with no
DATABASE_URL, no broker, nothing set; then every command the README and docs
show, typed as shown, in fresh processes, while it runs.

One copy of the checkout and one embedded server serve the module's tests, in
order; the last one stops it with Ctrl-C. The server is started under umask
000, so the privacy of var/ does not come from the test's shell.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.deployment.processes import ROOT, free_port, manage, shell_env
from tests.workers import wait_for

pytestmark = pytest.mark.embedded

DEVELOPMENT_KEY_WARNINGS = [
    "GATEHOUSE_MASTER_KEYS is not set",
    "GATEHOUSE_AUDIT_KEYS is not set",
]
POSTGRES_AND_REDIS_PORTS = {5432, 6379}
# Left out of the copy: what a fresh clone does not have (and the venv, which
# the copy links to instead of reinstalling).
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", ".venv", "var", "staticfiles", "__pycache__", ".*_cache", "test-results"
)


class EmbeddedServer:
    def __init__(self, checkout: Path, port: int) -> None:
        self.checkout = checkout
        self.url = f"http://127.0.0.1:{port}"
        self.python = str(checkout / ".venv" / "bin" / "python")
        self.log_path = checkout.parent / "make-run.log"
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [self.python, "manage.py", "run_embedded", "--bind", f"127.0.0.1:{port}"],
            cwd=checkout,
            env=shell_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            umask=0,
        )
        # pid -> start time (in clock ticks since boot): a pid that ends may be
        # reused by another process; the pair names one process.
        self.processes_seen: dict[int, int] = {}
        wait_for(
            lambda: self.process.poll() is not None or self.get("/healthz")[0] == 200,
            timeout=240,
            what="the embedded server to answer /healthz",
        )
        assert self.process.poll() is None, self.output()
        self.api_key = re.search(r"API key:\s+(\S+)", self.output())[1]

    def output(self) -> str:
        return self.log_path.read_text()

    def request(self, method: str, path: str, body: dict | None = None, key=None):
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"}
            | ({"Authorization": f"Bearer {key}"} if key else {}),
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")
        except (urllib.error.URLError, ConnectionError):
            return None, None

    def get(self, path: str, key=None):
        return self.request("GET", path, key=key)

    def descendants(self) -> set[int]:
        """Every process started under it (web, its workers, Celery's pool...)."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (fields := process_stat(int(entry.name))):
                parents[int(entry.name)] = int(fields[1])
        found, frontier = set(), {self.process.pid}
        while frontier:
            frontier = {pid for pid, ppid in parents.items() if ppid in frontier}
            found |= frontier
        for pid in found:
            if fields := process_stat(pid):
                self.processes_seen[pid] = int(fields[19])
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


def process_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: state, ppid, ... (None if gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkout = tmp_path_factory.mktemp("clone") / "gatehouse"
    shutil.copytree(ROOT, checkout, ignore=NOT_IN_A_CLONE)
    (checkout / ".venv").symlink_to(ROOT / ".venv")
    server = EmbeddedServer(checkout, free_port())
    yield server
    server.stop()


def documented_commands() -> set[str]:
    """The manage.py commands named in the README and docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {
        name
        for page in pages
        for name in re.findall(r"manage\.py ([a-z_]+)", page.read_text())
    }


# What a README line shows in place of a value the reader has: (placeholder,
# how the test gets the value). A line with a placeholder not here is not run
# as written (its command still runs, in the test above, with real values).
README_PLACEHOLDERS = ("gh_XXXXXXXXX",)


def readme_command_lines() -> list[str]:
    """The `manage.py` lines of the README's shell blocks, as written."""
    lines, in_block = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_block = line.strip() in ("```sh", "```bash", "```shell")
            continue
        if in_block and re.match(r"(\.venv/bin/)?python manage\.py ", line):
            lines.append(line)
    return lines


def test_make_run_prints_each_role_the_key_and_the_warning_once(server):
    output = server.output()
    for label in ("Reviewer:", "Compliance officer:", "Auditor:", "API key:"):
        assert label in output
    assert [output.count(warning) for warning in DEVELOPMENT_KEY_WARNINGS] == [1, 1]


def test_server_answers_probes_and_the_api_with_the_printed_key(server):
    assert server.get("/healthz") == (200, {"status": "ok"})
    status, ready = server.get("/readyz")
    assert status == 200 and ready["checks"] == {"database": "ok", "broker": "ok"}
    assert len(ready["warnings"]) == len(DEVELOPMENT_KEY_WARNINGS)
    for warning, start in zip(ready["warnings"], DEVELOPMENT_KEY_WARNINGS, strict=True):
        assert warning.startswith(start)
    status, agents = server.get("/api/v1/agents", key=server.api_key)
    assert status == 200 and "refund" in {agent["name"] for agent in agents}


def test_worker_runs_the_refund_agent_to_its_approval(server):
    key = server.api_key
    created = server.request(
        "POST", "/api/v1/threads", {"thread_id": "case-42", "agent": "refund"}, key
    )
    assert created[0] == 201, created
    refund = {
        "customer_message": "My blender arrived damaged",
        "order": {"id": "A-1001", "amount": "40.00"},
    }
    started = server.request(
        "POST", "/api/v1/threads/case-42/runs", {"input": refund}, key
    )
    assert started[0] == 202, started
    wait_for(
        lambda: (
            server.get("/api/v1/threads/case-42", key=key)[1]["status"] == "interrupted"
        ),
        timeout=120,
        what="the refund run to stop for approval",
    )


def test_the_readmes_command_lines_run_as_written(server):
    """Each `manage.py` line of the README, typed as shown into a shell in the
    checkout (`python` being the checkout's, as after activating its venv)."""
    env = shell_env(PATH=f"{server.checkout / '.venv' / 'bin'}:{os.environ['PATH']}")
    values: dict[str, str] = {}
    ran = []
    for line in readme_command_lines():
        command = line
        for placeholder in README_PLACEHOLDERS:
            if placeholder in command:
                command = command.replace(placeholder, values[placeholder])
        if "pkg.mod:fn" in command:
            continue  # names a function the reader writes; --help runs above
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=server.checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, (line, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, (line, result.stderr)
        assert "_KEYS is not set" not in result.stdout + result.stderr, line
        if "create_api_key" in command and "--user" not in command:
            values["gh_XXXXXXXXX"] = result.stdout.split()[-1].split(".")[0]
        ran.append(re.search(r"manage\.py ([a-z_]+)", line)[1])
    assert {"audit_report", "retention_run", "create_tenant", "create_api_key",
            "revoke_api_key", "audit_anchor", "verify_audit"} <= set(ran)  # fmt: skip


def test_each_documented_command_runs_with_nothing_typed_in_front(server):
    def run(*command: str) -> str:
        result = manage(
            *command, env=shell_env(), cwd=server.checkout, python=server.python
        )
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        assert "_KEYS is not set" not in result.stdout + result.stderr, command
        return result.stdout

    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    ran = {"run_embedded"}
    for command in [
        ["migrate"],
        ["check", "--deploy"],
        ["collectstatic", "--noinput"],
        ["create_tenant", "globex", "--name", "Globex"],
        ["create_reviewer", "--tenant", "globex", "--username", "gus"],
        ["audit_report", "--tenant", "demo", "--date", today],
        ["retention_run", "--dry-run"],
        ["verify_audit", "--tenant", "demo", "--seal"],
        ["audit_reseal_legacy"],
        ["rotate_master_key", "--help"],
        ["rotate_master_key"],
        ["agents_check"],
        ["threads_migrate", "--help"],
        ["sqlmigrate", "runs", "0027"],
    ]:
        run(*command)
        ran.add(command[0])
    secret = run("create_api_key", "--tenant", "globex", "--scopes", "runs,audit")
    run("revoke_api_key", secret.split()[-1].split(".")[0])
    heads = server.checkout.parent / "heads.jsonl"
    heads.write_text(run("audit_anchor"))
    run("verify_audit", "--against", str(heads))
    ran |= {"create_api_key", "revoke_api_key", "audit_anchor"}

    # Postgres's roles: the command says so in one line, in the embedded mode.
    roles = manage(
        "grant_app_role",
        "gatehouse_app",
        env=shell_env(),
        cwd=server.checkout,
        python=server.python,
    )
    assert roles.returncode == 1 and "Traceback" not in roles.stderr
    assert "grant_app_role is for Postgres" in roles.stderr
    assert documented_commands() <= ran | {"grant_app_role"}


def test_var_files_are_private_while_it_runs(server):
    var = server.checkout / "var"
    modes = {
        str(path.relative_to(var)): stat.S_IMODE(path.lstat().st_mode)
        for path in [var, *var.rglob("*")]
    }
    # The SQLite write-ahead log and shared memory, the broker's folders.
    assert {"gatehouse.sqlite3-wal", "gatehouse.sqlite3-shm", "broker/queue"} <= set(
        modes
    )
    exposed = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (0o700 if (var / name).is_dir() else 0o600)
    }
    assert exposed == {}


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:  # the process ended meanwhile
        pass
    return inodes


def _remote_tcp_ports(inodes: set[str]) -> set[int]:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def test_nothing_connects_to_postgres_or_redis(server):
    server.get("/readyz")
    server.get("/api/v1/threads", key=server.api_key)
    processes = server.descendants() | {server.process.pid}
    assert len(processes) >= 6  # web and its worker, Celery and its pool, beat
    # (This machine's Postgres and Redis listen on TCP, 127.0.0.1.)
    ports = _remote_tcp_ports(set().union(*map(_socket_inodes, processes)))
    assert ports & POSTGRES_AND_REDIS_PORTS == set()


def test_ctrl_c_stops_every_process(server):
    server.descendants()
    os.kill(server.process.pid, signal.SIGINT)
    assert server.process.wait(timeout=90) == 0
    assert "stopped web, worker and beat" in server.output()

    def alive(pid: int, started: int) -> bool:
        fields = process_stat(pid)
        return bool(fields) and fields[0] != "Z" and int(fields[19]) == started

    wait_for(
        lambda: not any(alive(*seen) for seen in server.processes_seen.items()),
        timeout=30,
        what="every process of the embedded mode to exit",
    )
