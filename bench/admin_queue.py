"""Reviewer queue benchmark: SQL queries and time of the admin's queue page and
dashboard, with 100,000 pending approval requests across 100 tenants.

    make bench-admin                  # or: python bench/admin_queue.py --help

Runs against one Postgres (DATABASE_URL names the server; the benchmark works
in its own database, `gatehouse_bench_admin`, created and dropped here). The
requests are what the desk really lists: each on its own thread with its own
data key, its payload encrypted with it, 10 % of them escalated; besides them,
decided requests with decisions over the last 30 days, for the dashboard's
reviewer statistics. Both pages are fetched in-process with Django's test
client (middleware, templates and all) as a superuser, as a reviewer of one
tenant and, for the dashboard's statistics, as a compliance officer of one
tenant; first with 1,000 pending requests, then with 100,000, so that the query
counts can be compared. Results go to the "Reviewer queue" section of
docs/benchmarks.md (`bench/benchmarks_doc.py` keeps the other sections).

Target: at most 15 queries per page whatever the number of requests, and each
page under 300 ms.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import platform
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DB_NAME = "gatehouse_bench_admin"
TENANTS = 100
QUEUE = "/admin/approvals/approvalrequest/"
DASHBOARD = "/admin/approvals/approvalrequest/dashboard/"
QUERY_TARGET = 15
TIME_TARGET_MS = 300
BATCH = 5_000


# --- setup -----------------------------------------------------------------------


def _server_url(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _recreate_database(server_url: str, *, drop_only: bool = False) -> None:
    import psycopg

    admin = _server_url(server_url, "postgres").replace("postgres://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def _setup_django(bench_url: str) -> None:
    os.environ["DATABASE_URL"] = bench_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DEBUG"] = "false"
    os.environ["ALLOWED_HOSTS"] = "testserver"
    # The test client speaks plain http; production would redirect it to https.
    os.environ["SECURE_SSL_REDIRECT"] = "false"
    os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-key")
    # A fixed key, so that a kept database (--keep-database) can be measured
    # again (--measure-only); the database holds nothing but generated data.
    key = hashlib.sha256(b"gatehouse bench admin queue").digest()
    os.environ.setdefault(
        "GATEHOUSE_MASTER_KEYS", "bench:" + base64.b64encode(key).decode()
    )
    audit_key = hashlib.sha256(b"gatehouse bench admin queue audit").digest()
    os.environ.setdefault(
        "GATEHOUSE_AUDIT_KEYS", "bench-audit:" + base64.b64encode(audit_key).decode()
    )
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django
    from django.core.management import call_command

    import config.settings as production

    # Production settings, except that static files are not collected here:
    # the pages link the apps' own files, unhashed (as the test suite does).
    production.STORAGES = {
        **production.STORAGES,
        "staticfiles": {
            "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        },
    }
    django.setup()
    call_command("migrate", verbosity=0)


# --- the data ----------------------------------------------------------------------


class Filler:
    """Bulk-inserts tenants, threads, runs, requests and decisions."""

    def __init__(self, seed: int = 7) -> None:
        from django.contrib.auth import get_user_model

        from runs.models import Membership, Tenant

        self.random = random.Random(seed)
        self.now = datetime.now(UTC)
        self.tenants = Tenant.objects.bulk_create(
            [Tenant(slug=f"tenant-{n:03d}", name=f"Tenant {n}") for n in range(TENANTS)]
        )
        User = get_user_model()
        self.reviewers = {}
        users, memberships = [], []
        for tenant in self.tenants:
            for n in range(2):
                users.append(
                    User(username=f"{tenant.slug}-reviewer-{n}", is_staff=True)
                )
        User.objects.bulk_create(users)
        for index, user in enumerate(User.objects.order_by("pk")):
            tenant = self.tenants[index // 2]
            self.reviewers.setdefault(tenant.pk, []).append(user)
            memberships.append(Membership(user=user, tenant=tenant, role="reviewer"))
        Membership.objects.bulk_create(memberships)
        self.serial = 0

    def _payload(self, order_id: str, amount: str) -> dict:
        return {
            "action": "refund_order",
            "args": {"order_id": order_id, "amount": amount, "currency": "EUR"},
            "reason": "The customer reports the item arrived damaged; photo attached.",
            "affects": f"Refunds {amount} EUR to the original payment method.",
            "if_denied": "No money moves; the customer is told why.",
        }

    def requests(self, per_tenant: int, *, decided: bool = False) -> int:
        """`per_tenant` requests for every tenant, pending or decided."""
        from django.db import transaction

        from approvals.cards import card_hash
        from approvals.content import decision_row, payload_row
        from approvals.desk_models import DecisionSnapshot
        from approvals.models import ApprovalRequest, Decision
        from demo.agents.refund import risk_for
        from runs import crypto
        from runs.models import Run, Thread

        total = per_tenant * len(self.tenants)
        rows = [(tenant, i) for tenant in self.tenants for i in range(per_tenant)]
        for start in range(0, total, BATCH):
            batch = rows[start : start + BATCH]
            with transaction.atomic():
                threads = []
                for tenant, _ in batch:
                    self.serial += 1
                    threads.append(
                        Thread(
                            tenant=tenant,
                            thread_id=f"case-{self.serial}",
                            agent_name="refund",
                            agent_version="1",
                            status="idle" if decided else "interrupted",
                        )
                    )
                Thread.objects.bulk_create(threads)
                # Each wrapped key is bound to its thread's pk, known now.
                for thread in threads:
                    key = crypto.new_data_key(
                        tenant_id=thread.tenant_id,
                        owner=crypto.thread_key_owner(thread.pk),
                    )
                    thread.wrapped_data_key = key.wrapped
                    thread.data_key_id = key.key_id
                Thread.objects.bulk_update(threads, ["wrapped_data_key", "data_key_id"])
                runs = [
                    Run(
                        tenant=thread.tenant,
                        thread=thread,
                        kind="start",
                        status="succeeded" if decided else "interrupted",
                        agent_version="1",
                        next_nodes=[] if decided else ["request_approval"],
                    )
                    for thread in threads
                ]
                Run.objects.bulk_create(runs)
                requests, decisions, snapshots = [], [], []
                for thread, run in zip(threads, runs, strict=True):
                    amount = f"{self.random.choice([25, 40, 120, 300, 900])}.00"
                    risk = risk_for(amount)
                    age = timedelta(seconds=self.random.uniform(0, 48 * 3600))
                    created = self.now - age
                    escalated = not decided and self.random.random() < 0.1
                    request = ApprovalRequest(
                        tenant=thread.tenant,
                        thread=thread,
                        run=run,
                        interrupt_id=uuid.uuid4().hex,
                        risk=risk,
                        action="refund_order",
                        required_approvals=2 if risk == "high" else 1,
                        created_at=created,
                        due_at=created
                        + timedelta(hours={"low": 24, "medium": 8, "high": 4}[risk]),
                        escalation_level=1 if escalated else 0,
                        escalated_at=created + timedelta(hours=4)
                        if escalated
                        else None,
                    )
                    cipher = crypto.ThreadCipher.for_thread(thread)
                    payload = self._payload(f"A-{self.serial}", amount)
                    request.payload = cipher.encrypt_value(
                        payload, row=payload_row(request)
                    )
                    if decided:
                        approved = self.random.random() < 0.8
                        request.status = "approved" if approved else "denied"
                        request.required_approvals = 1
                        decided_at = created + timedelta(
                            seconds=self.random.uniform(5, 1800)
                        )
                        request.decided_at = decided_at
                        reviewer = self.random.choice(self.reviewers[thread.tenant_id])
                        decision = Decision(
                            request=request,
                            approved=approved,
                            principal=f"user:{reviewer.pk}",
                            reviewer_user=reviewer,
                            reviewer_label=reviewer.username,
                            created_at=decided_at,
                        )
                        decision.detail = cipher.encrypt_value(
                            {"note": "", "args": None, "edits": []},
                            row=decision_row(decision),
                        )
                        decisions.append(decision)
                        card = {"approval_id": str(request.id), **payload}
                        snapshot = DecisionSnapshot(
                            decision=decision,
                            first_opened_at=decided_at
                            - timedelta(seconds=self.random.uniform(3, 600)),
                            rendered_at=decided_at,
                            content_hash=card_hash(card),
                        )
                        snapshot.card = cipher.encrypt_value(
                            card, row=("decision-snapshot", str(snapshot.id))
                        )
                        snapshots.append(snapshot)
                    requests.append(request)
                ApprovalRequest.objects.bulk_create(requests)
                Decision.objects.bulk_create(decisions)
                DecisionSnapshot.objects.bulk_create(snapshots)
            print(f"  {min(start + BATCH, total):>7,} of {total:,}", end="\r")
        print()
        return total


def _vacuum() -> None:
    """What autovacuum does to a table that settled: statistics, and the
    visibility map that lets counts be answered from an index alone."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


# --- measuring ---------------------------------------------------------------------


def _clients():
    from django.contrib.auth import get_user_model
    from django.test import Client

    from runs.models import Membership, Tenant

    User = get_user_model()
    superuser, _ = User.objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    tenant = Tenant.objects.order_by("slug").first()
    reviewer, _ = User.objects.get_or_create(
        username="bench-reviewer", defaults={"is_staff": True}
    )
    officer, _ = User.objects.get_or_create(
        username="bench-officer", defaults={"is_staff": True}
    )
    Membership.objects.get_or_create(user=reviewer, tenant=tenant, role="reviewer")
    Membership.objects.get_or_create(
        user=officer, tenant=tenant, role="compliance_officer"
    )
    clients = {}
    for label, user in [
        ("superuser", superuser),
        ("reviewer of one tenant", reviewer),
        ("compliance officer of one tenant", officer),
    ]:
        client = Client()
        client.force_login(user)
        clients[label] = client
    return clients


def measure(client, url: str, samples: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm: templates, key cache, plans
    assert response.status_code == 200, (url, response.status_code)
    timings, cpu = [], []
    for _ in range(samples):
        with CaptureQueriesContext(connection) as queries:
            started, started_cpu = time.perf_counter(), time.process_time()
            response = client.get(url)
            timings.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - started_cpu) * 1000)
        assert response.status_code == 200
    return {
        "queries": len(queries),
        "median_ms": statistics.median(timings),
        "max_ms": max(timings),
        "cpu_ms": statistics.median(cpu),
    }


PAGES = [
    ("queue", QUEUE, ("superuser", "reviewer of one tenant")),
    (
        "dashboard",
        DASHBOARD,
        ("superuser", "reviewer of one tenant", "compliance officer of one tenant"),
    ),
]


def measure_all(clients, samples: int) -> dict:
    results = {}
    for page, url, who in PAGES:
        for label in who:
            results[(page, label)] = measure(clients[label], url, samples)
            row = results[(page, label)]
            print(
                f"  {page:9} {label:34} {row['queries']:>3} queries  "
                f"median {row['median_ms']:7.1f} ms  max {row['max_ms']:7.1f} ms  "
                f"web CPU {row['cpu_ms']:6.1f} ms"
            )
    return results


def report(
    args, small: dict, large: dict, pending_small: int, pending_large: int, decided: int
) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
    lines = [
        "## Reviewer queue (`bench/admin_queue.py`)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Django {version('django')}, PostgreSQL "
        f"{pg_version.split()[0]} on localhost. {pending_large:,} pending approval "
        f"requests across {TENANTS} tenants (each on its own thread, payload "
        f"encrypted with the thread's key, 10 % escalated) and {decided:,} decided "
        "ones with decisions in the last 30 days. Each page fetched in-process "
        f"with Django's test client, {args.samples} times after one warm-up; "
        "the query count is the whole request's (session, user, memberships "
        "included). Load average while measuring: "
        f"{args.load_average}.",
        "",
        f"| page | who | queries at {pending_small:,} | queries at "
        f"{pending_large:,} | median | max | web process CPU (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    worst_queries, worst_ms = 0, 0.0
    for (page, label), row in large.items():
        before = small[(page, label)]["queries"]
        worst_queries = max(worst_queries, row["queries"], before)
        worst_ms = max(worst_ms, row["median_ms"])
        lines.append(
            f"| {page} | {label} | {before} | {row['queries']} | "
            f"{row['median_ms']:.1f} ms | {row['max_ms']:.1f} ms | "
            f"{row['cpu_ms']:.1f} ms |"
        )
    constant = all(large[key]["queries"] == small[key]["queries"] for key in large)
    met = lambda ok: "**met**" if ok else "**missed**"  # noqa: E731
    lines += [
        "",
        f"Target: at most {QUERY_TARGET} queries per page, independent of the "
        f"number of requests: {met(worst_queries <= QUERY_TARGET and constant)} "
        f"(at most {worst_queries}, {'the same' if constant else 'not the same'} "
        f"at both sizes). Median under {TIME_TARGET_MS} ms: "
        f"{met(worst_ms < TIME_TARGET_MS)} (slowest median {worst_ms:.1f} ms).",
        "",
        "The queue reads the page's 50 rows in the order of index "
        "`approval_queue` (pending first, soonest due first) with their threads, "
        "so their keys, in one query, and decrypts only their payloads; the "
        "total is a count from an index. The dashboard's per-tenant counts by "
        "age are one index-only scan of the partial index "
        "`approval_pending_age`; the oldest waiting come from the same index; "
        "the reviewers' figures are one aggregate query over the last 30 days' "
        "decisions, the median with PostgreSQL's `percentile_cont`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument(
        "--first",
        type=int,
        default=1_000,
        help="pending requests at the first measurement",
    )
    parser.add_argument("--decided", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument(
        "--no-write", action="store_true", help="print, leave docs/benchmarks.md"
    )
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="measure a database kept by an earlier --keep-database run",
    )
    args = parser.parse_args()
    if args.measure_only:
        server_url = os.environ.get(
            "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gatehouse"
        )
        _setup_django(_server_url(server_url, DB_NAME))
        measure_all(_clients(), args.samples)
        return

    server_url = os.environ.get(
        "DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gatehouse"
    )
    if not server_url.startswith("postgres"):
        sys.exit("DATABASE_URL must point at PostgreSQL")
    _recreate_database(server_url)
    try:
        _setup_django(_server_url(server_url, DB_NAME))
        print(f"filling: {TENANTS} tenants, {args.decided:,} decided requests")
        filler = Filler()
        decided = filler.requests(args.decided // TENANTS, decided=True)
        print(f"filling: {args.first:,} pending requests")
        pending_small = filler.requests(args.first // TENANTS)
        _vacuum()
        clients = _clients()
        print(f"measuring at {pending_small:,} pending")
        small = measure_all(clients, args.samples)
        loads = [os.getloadavg()[0]]
        print(f"filling: up to {args.pending:,} pending requests")
        pending_large = pending_small + filler.requests(
            (args.pending - pending_small) // TENANTS
        )
        _vacuum()
        print(f"measuring at {pending_large:,} pending")
        large = measure_all(clients, args.samples)
        loads.append(os.getloadavg()[0])
        args.load_average = " and ".join(f"{load:.1f}" for load in loads)
        section = report(args, small, large, pending_small, pending_large, decided)
        print()
        print(section)
        if not args.no_write:
            from bench.benchmarks_doc import DOC, write_section

            write_section("Reviewer queue", section)
            print(f"written to {DOC}")
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_database:
            _recreate_database(server_url, drop_only=True)


if __name__ == "__main__":
    main()
