"""runs.fixed_queries: a query compiled once answers as the ORM would, call
after call, with each call's own arguments; save_fields writes what
Model.save writes."""

import uuid

import pytest
from django.apps import apps
from django.db import (
    DatabaseError,
    IntegrityError,
    connection,
    connections,
    transaction,
)
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now
from django.db.models.signals import post_save
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit import events
from audit.models import AuditEvent
from audit.services import Actor
from runs import execution, services, tools
from runs.fixed_queries import FixedQuery, insert_statement, save_fields, save_new
from runs.models import Run, Tenant, Thread, ToolCall
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db

SAMPLE = uuid.UUID("00000000-0000-4000-8000-0000000000aa")


def _thread_with_runs(tenant, count: int) -> tuple[Thread, list[Run]]:
    thread = services.thread_create(
        tenant=tenant, agent="refund", actor=Actor.system("t")
    )
    runs = [
        Run.objects.create(
            tenant=tenant, thread=thread, kind="start", agent_version="1"
        )
        for _ in range(count)
    ]
    return thread, runs


def _fields(obj) -> dict:
    return {field.attname: getattr(obj, field.attname) for field in obj._meta.fields}


def test_the_claims_queries_answer_as_the_orm_does_for_each_run():
    tenant = make_tenant()
    thread, (first, second) = _thread_with_runs(tenant, 2)
    _, (other,) = _thread_with_runs(make_tenant(), 1)
    Run.objects.filter(pk=first.pk).update(status=Run.Status.RUNNING)
    with transaction.atomic():
        for run in (first, second, other):
            (fixed,) = execution._CLAIM_RUN(run.pk)
            (orm,) = execution._CLAIM_RUN.build(run.pk)
            assert _fields(fixed) == _fields(orm)
            assert (fixed.behind, fixed.waiting_nodes) == (
                orm.behind,
                orm.waiting_nodes,
            )
            (locked,) = execution._CLAIM_THREAD(run.pk)
            assert locked.pk == run.thread_id
            # select_related: the tenant comes with the thread, no query.
            assert _fields(locked.tenant) == _fields(run.thread.tenant)
        # The second run waits for the first: the annotations are per call.
        assert [r.behind for r in execution._CLAIM_RUN(first.pk)] == [False]
        assert [r.behind for r in execution._CLAIM_RUN(second.pk)] == [True]
        (finish,) = execution._FINISH(first.pk)
        (orm,) = execution._FINISH.build(first.pk)
        assert _fields(finish) == _fields(orm)
        # select_related: the thread and its tenant come with the run.
        assert _fields(finish.thread) == _fields(thread)
        assert _fields(finish.thread.tenant) == _fields(tenant)
        assert execution._CLAIM_THREAD(uuid.uuid4()) == []
        assert execution._FINISH(uuid.uuid4()) == []


@pytest.mark.django_db(transaction=True)
def test_a_locking_query_is_refused_outside_a_transaction():
    _, (run,) = _thread_with_runs(make_tenant(), 1)
    with pytest.raises(TransactionManagementError):
        execution._CLAIM_RUN(run.pk)


def test_an_argument_of_another_type_is_refused():
    _, (run,) = _thread_with_runs(make_tenant(), 1)
    with transaction.atomic(), pytest.raises(TypeError):
        execution._CLAIM_RUN(str(run.pk))


def test_a_sample_the_query_does_not_hold_is_refused():
    query = FixedQuery(lambda run_id: Run.objects.filter(status="queued"), SAMPLE)
    with pytest.raises(ValueError, match="not among its parameters"):
        query(uuid.uuid4())


def test_an_argument_used_twice_fills_both_places():
    _, (run,) = _thread_with_runs(make_tenant(), 1)
    query = FixedQuery(
        lambda run_id: Run.objects.filter(
            Exists(Run.objects.filter(pk=run_id, thread_id=OuterRef("thread_id"))),
            pk=run_id,
        ),
        SAMPLE,
    )
    assert [r.pk for r in query(run.pk)] == [run.pk]
    assert query(uuid.uuid4()) == []


def test_save_fields_writes_what_model_save_writes():
    thread, (run,) = _thread_with_runs(make_tenant(), 1)
    before = Thread.objects.get(pk=thread.pk).updated_at
    run.status, run.next_nodes, run.error = "failed", ["ask"], b"\x00sealed"
    run.ended_at = timezone.now()
    save_fields(run, ("status", "next_nodes", "error", "ended_at"))
    thread.status, thread.gated_nodes = "error", ["ask"]
    save_fields(thread, ("status", "gated_nodes", "updated_at"))
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.next_nodes, bytes(stored.error)) == (
        "failed",
        ["ask"],
        b"\x00sealed",
    )
    assert stored.ended_at == run.ended_at
    stored_thread = Thread.objects.get(pk=thread.pk)
    assert (stored_thread.status, stored_thread.gated_nodes) == ("error", ["ask"])
    # auto_now, as Model.save sets it, on the instance too.
    assert stored_thread.updated_at == thread.updated_at > before
    # Only the fields named.
    run.status, run.error_type = "succeeded", "Nope"
    save_fields(run, ("status",))
    assert Run.objects.get(pk=run.pk).error_type == ""


def test_save_fields_of_a_row_gone_is_an_error_as_with_model_save():
    _, (run,) = _thread_with_runs(make_tenant(), 1)
    Run.objects.filter(pk=run.pk).delete()
    run.status = "running"
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        save_fields(run, ("status",))


def test_save_fields_leaves_it_to_model_save_when_someone_listens():
    _, (run,) = _thread_with_runs(make_tenant(), 1)
    heard = []

    def listener(sender, instance, update_fields, **kwargs):
        heard.append((instance.pk, sorted(update_fields)))

    post_save.connect(listener, sender=Run)
    try:
        run.status = "running"
        save_fields(run, ("status",))
    finally:
        post_save.disconnect(listener, sender=Run)
    assert heard == [(run.pk, ["status"])]
    assert Run.objects.get(pk=run.pk).status == "running"


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_the_claims_queries_and_save_fields_on_sqlite_the_embedded_mode():
    """SQLite has no uuid type: Django sends a UUID as its hex string, and so
    must a compiled query's arguments (b07defc sent the UUID itself, and every
    claim of the embedded mode failed: "not among its parameters")."""
    tenant = Tenant.objects.using("sqlite").create(slug="embedded", name="E")
    threads = Thread.objects.using("sqlite")
    thread = threads.create(
        tenant=tenant, thread_id="t1", agent_name="refund", agent_version="1"
    )
    runs = Run.objects.using("sqlite")
    first, second = (
        runs.create(tenant=tenant, thread=thread, kind="start", agent_version="1")
        for _ in range(2)
    )
    runs.filter(pk=first.pk).update(status=Run.Status.RUNNING)
    with transaction.atomic(using="sqlite"):
        for run in (first, second):
            (fixed,) = execution._CLAIM_RUN(run.pk, using="sqlite")
            (orm,) = execution._CLAIM_RUN.build(run.pk).using("sqlite")
            assert _fields(fixed) == _fields(orm)
            assert (fixed.behind, fixed.waiting_nodes) == (
                orm.behind,
                orm.waiting_nodes,
            )
            (locked,) = execution._CLAIM_THREAD(run.pk, using="sqlite")
            assert locked.pk == thread.pk and locked.tenant.pk == tenant.pk
        # The second run waits for the first: the annotations are per call.
        assert [r.behind for r in execution._CLAIM_RUN(second.pk, using="sqlite")] == [
            True
        ]
        (finish,) = execution._FINISH(first.pk, using="sqlite")
        assert finish.thread.pk == thread.pk and finish.thread.tenant.pk == tenant.pk
        assert execution._CLAIM_THREAD(uuid.uuid4(), using="sqlite") == []

        first.status, first.next_nodes, first.error = "failed", ["ask"], b"\x00sealed"
        first.ended_at = timezone.now()
        save_fields(
            first, ("status", "next_nodes", "error", "ended_at"), using="sqlite"
        )
        stored = runs.get(pk=first.pk)
        assert (stored.status, stored.next_nodes, bytes(stored.error)) == (
            "failed",
            ["ask"],
            b"\x00sealed",
        )
        assert stored.ended_at == first.ended_at
        thread.status = "error"
        save_fields(thread, ("status", "updated_at"), using="sqlite")
        assert threads.get(pk=thread.pk).status == "error"


def test_save_fields_leaves_it_to_the_models_own_save_when_it_has_one():
    """A model's save() (a guard, a validation added later) is never skipped."""
    _, (run,) = _thread_with_runs(make_tenant(), 1)
    saved = []

    class GuardedRun(Run):
        class Meta:
            proxy = True
            app_label = "runs"

        def save(self, *args, **kwargs):
            saved.append(sorted(kwargs["update_fields"]))
            super().save(*args, **kwargs)

    try:
        guarded = GuardedRun.objects.get(pk=run.pk)
        guarded.status = "running"
        save_fields(guarded, ("status",))
    finally:
        del apps.all_models["runs"]["guardedrun"]
        apps.clear_cache()
    assert saved == [["status"]]
    assert Run.objects.get(pk=run.pk).status == "running"


def test_the_decisions_locked_reads_find_only_the_tenants_live_request():
    """The decision's request read (approvals.api.views) and the thread lock
    (runs.services.thread_locked), compiled once: each call its own tenant
    and ids; another tenant's request, or a deleted thread's, is not found."""
    from approvals.api.views import _LOCKED_REQUEST
    from tests.approvals.helpers import waiting_request

    tenant, other = make_tenant(), make_tenant()
    mine, theirs = waiting_request(tenant), waiting_request(other)
    with transaction.atomic():
        (found,) = _LOCKED_REQUEST(tenant.pk, mine.pk)
        assert (found.pk, found.tenant.pk, found.thread.pk) == (
            mine.pk,
            tenant.pk,
            mine.thread_id,
        )
        assert _LOCKED_REQUEST(tenant.pk, theirs.pk) == []
        assert _LOCKED_REQUEST(other.pk, theirs.pk)[0].pk == theirs.pk
        locked = services.thread_locked(mine.thread_id)
        assert _fields(locked) == _fields(Thread.objects.get(pk=mine.thread_id))
        assert locked.tenant.pk == tenant.pk
        Thread.objects.filter(pk=mine.thread_id).update(deleted_at=timezone.now())
        assert _LOCKED_REQUEST(tenant.pk, mine.pk) == []
        # A tombstone is the caller's to refuse (run_resume does).
        assert services.thread_locked(mine.thread_id).deleted_at is not None


@pytest.mark.django_db(databases=["default", "sqlite"])
def test_the_thread_lock_on_sqlite_the_embedded_mode():
    tenant = Tenant.objects.using("sqlite").create(slug="embedded", name="E")
    thread = Thread.objects.using("sqlite").create(
        tenant=tenant, thread_id="t1", agent_name="refund"
    )
    with transaction.atomic(using="sqlite"):
        (locked,) = services.runs._LOCKED_THREAD(thread.pk, using="sqlite")
    assert (locked.pk, locked.tenant.pk) == (thread.pk, tenant.pk)


def test_the_live_thread_and_run_lookups_keep_to_the_tenant_and_live_threads():
    """runs.selectors.live_thread/live_run, compiled once, behind most API
    requests: another tenant's thread or run, or a deleted thread's, is None."""
    from runs import selectors

    tenant, other = make_tenant(), make_tenant()
    thread, (run,) = _thread_with_runs(tenant, 1)
    theirs, (their_run,) = _thread_with_runs(other, 1)
    found = selectors.live_thread(tenant, thread.thread_id)
    assert (found.pk, found.tenant.pk) == (thread.pk, tenant.pk)
    assert selectors.live_thread(tenant, theirs.thread_id) is None
    got = selectors.live_run(tenant, thread.thread_id, str(run.pk))
    assert (got.pk, got.thread.pk, got.thread.tenant.pk) == (
        run.pk,
        thread.pk,
        tenant.pk,
    )
    assert selectors.live_run(tenant, theirs.thread_id, their_run.pk) is None
    assert selectors.live_run(other, thread.thread_id, run.pk) is None
    Thread.objects.filter(pk=thread.pk).update(deleted_at=timezone.now())
    assert selectors.live_thread(tenant, thread.thread_id) is None
    assert selectors.live_run(tenant, thread.thread_id, run.pk) is None


def _queue_a_run(tenant) -> tuple[Run, list[str]]:
    """A run queued over the services (run.queued) in a transaction of its
    own, as a request's, and the SQL it took. The thread's creation commits
    first: the tenant's audit sequence row is then known to be there, which
    a write in the statement of its event needs (audit.services._SEQUENCED)."""
    thread = services.thread_create(
        tenant=tenant, agent="refund", actor=Actor.system("t")
    )
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        run = services.run_start(
            thread=thread,
            input={"customer_message": "hi", "order": {"id": "A-1"}},
            actor=Actor.system("t"),
        )
    return run, [q["sql"] for q in captured.captured_queries]


@pytest.mark.django_db(transaction=True)
def test_a_queued_run_is_inserted_in_the_statement_of_its_event(dispatched):
    run, sql = _queue_a_run(make_tenant())
    (insert,) = [s for s in sql if 'INSERT INTO "runs_run"' in s]
    assert insert.startswith("WITH w0 AS (INSERT") and '"audit_auditevent"' in insert
    assert len([s for s in sql if '"audit_auditevent"' in s]) == 1
    assert Run.objects.get(pk=run.pk).status == Run.Status.QUEUED


@pytest.mark.django_db(transaction=True)
def test_a_queued_run_is_saved_by_model_save_when_someone_listens(dispatched):
    """insert_statement stands aside as save_fields does: the receivers of
    the run's post_save hear of it (a raw INSERT skipped them)."""
    heard = []

    def listener(sender, instance, created, **kwargs):
        heard.append((instance.pk, created))

    post_save.connect(listener, sender=Run)
    try:
        run, sql = _queue_a_run(make_tenant())
    finally:
        post_save.disconnect(listener, sender=Run)
    assert heard == [(run.pk, True)]
    (insert,) = [s for s in sql if 'INSERT INTO "runs_run"' in s]
    assert insert.startswith('INSERT INTO "runs_run"')
    # Its event still written, after it, in the same transaction.
    event = AuditEvent.objects.get(kind="run.queued", run_id=str(run.pk))
    assert event.thread_id == run.thread.thread_id


def _ledger_row(thread: Thread, key: str) -> ToolCall:
    return ToolCall(
        tenant=thread.tenant,
        thread=thread,
        idempotency_key=key,
        tool="refund",
        status=ToolCall.Status.STARTED,
        started_at=timezone.now(),
    )


def _ledger_event(thread: Thread, key: str) -> dict:
    return {
        "tenant": thread.tenant,
        "kind": events.TOOL_CALL_STARTED,
        "actor": Actor.agent("refund"),
        "thread_id": thread.thread_id,
        "action": "refund",
        "data": {"tool": "refund", "key": key, "attempt": 1},
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("listening", [False, True])
def test_the_ledgers_insert_of_a_key_taken_writes_nothing(listening):
    """runs.tools: the ledger row with its tool_call.started, unless its key
    is there already; with a receiver of ToolCall's post_save, through
    Model.save (the receiver hears of the new row only), not the statement."""
    thread, _ = _thread_with_runs(make_tenant(), 0)
    heard = []

    def listener(sender, instance, created, **kwargs):
        heard.append((instance.idempotency_key, created))

    if listening:
        post_save.connect(listener, sender=ToolCall)
    try:
        with CaptureQueriesContext(connection) as captured:
            first = _ledger_row(thread, "k-1")
            assert tools._insert_new(first, _ledger_event(thread, "k-1"))
            again = _ledger_row(thread, "k-1")
            assert not tools._insert_new(again, _ledger_event(thread, "k-1"))
    finally:
        post_save.disconnect(listener, sender=ToolCall)
    assert heard == ([("k-1", True)] if listening else [])
    assert ToolCall.objects.get(thread=thread, idempotency_key="k-1").pk == first.pk
    assert first.pk is not None and not first._state.adding
    started = AuditEvent.objects.filter(
        thread_id=thread.thread_id, kind="tool_call.started"
    )
    assert started.count() == 1
    inserts = [q["sql"] for q in captured if 'INSERT INTO "runs_toolcall"' in q["sql"]]
    if listening:
        assert all(s.startswith('INSERT INTO "runs_toolcall"') for s in inserts)
    else:  # each one statement with its event
        assert len(inserts) == 2
        assert all(s.startswith("WITH w0 AS (INSERT") for s in inserts)


@pytest.mark.django_db(databases=["default", "sqlite"])
@pytest.mark.parametrize("using", ["default", "sqlite"])
def test_an_insert_compiled_once_writes_each_rows_own_values(using):
    """insert_statement compiles a model's INSERT once per process and
    database: the rows after the first are written with their own values,
    as Model.save writes them (auto_now_add's pre_save run: on the instance
    too). A row holding an expression is compiled for itself, and the
    plain rows after it still share the first one's SQL."""
    tenant = Tenant.objects.using(using).create(slug=f"i-{using}", name="I")
    thread = Thread.objects.using(using).create(
        tenant=tenant, thread_id="t1", agent_name="refund", agent_version="1"
    )
    rows = [_ledger_row(thread, f"k-{i}") for i in range(4)]
    rows[1].tool, rows[1].attempt_log, rows[1].args = "other", [{"n": 1}], b"\x00s"
    rows[2].started_at = Now()
    statements = [
        insert_statement(row, ignore_conflicts=True, using=using) for row in rows
    ]
    plain = {statements[i][0] for i in (0, 1, 3)}
    assert len(plain) == 1 and statements[2][0] not in plain
    with connections[using].cursor() as cursor:
        for row, (sql, params) in zip(rows, statements, strict=True):
            cursor.execute(sql, params)
            row.pk = cursor.fetchone()[0]
    stored = ToolCall.objects.using(using).in_bulk([row.pk for row in rows])
    for row in (rows[0], rows[1], rows[3]):
        assert _fields(stored[row.pk]) == {
            **_fields(row),
            "args": row.args and memoryview(row.args),
        }
    assert stored[rows[2].pk].started_at is not None
    # A key taken: nothing written, no row returned.
    sql, params = insert_statement(
        _ledger_row(thread, "k-0"), ignore_conflicts=True, using=using
    )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        assert cursor.fetchone() is None


@pytest.mark.django_db(transaction=True, databases=["default", "sqlite"])
@pytest.mark.parametrize("using", ["default", "sqlite"])
def test_a_receivers_unique_violation_is_raised_not_read_as_the_key_taken(using):
    """save_new(ignore_conflicts): only a unique violation on the row's own
    table means its key is there already. One raised by a post_save
    receiver's write to another table (here a tenant's slug taken) is the
    receiver's error: raised, and nothing of the savepoint kept (899795e
    answered False, as if the ledger's key were there)."""
    tenants = Tenant.objects.using(using)
    tenant = tenants.create(slug="taken", name="T")
    thread = Thread.objects.using(using).create(
        tenant=tenant, thread_id="t1", agent_name="refund", agent_version="1"
    )

    def listener(sender, instance, created, **kwargs):
        tenants.create(slug="taken", name="again")

    post_save.connect(listener, sender=ToolCall)
    try:
        with pytest.raises(IntegrityError):
            save_new(_ledger_row(thread, "k-1"), ignore_conflicts=True, using=using)
    finally:
        post_save.disconnect(listener, sender=ToolCall)
    assert not ToolCall.objects.using(using).filter(idempotency_key="k-1").exists()
    # The row's own key taken still reads as such, on either database.
    assert save_new(_ledger_row(thread, "k-2"), ignore_conflicts=True, using=using)
    assert not save_new(_ledger_row(thread, "k-2"), ignore_conflicts=True, using=using)
    assert not save_new(
        tenants.model(slug="taken", name="x"), ignore_conflicts=True, using=using
    )


@pytest.mark.django_db(transaction=True)
def test_the_ledgers_insert_raises_a_receivers_unique_violation():
    """runs.tools: a receiver of ToolCall's post_save whose own write
    violates another table's key fails the ledger's insert; it is not read
    as the key taken (which would skip the tool call's record)."""
    tenant = make_tenant()
    thread, _ = _thread_with_runs(tenant, 0)

    def listener(sender, instance, created, **kwargs):
        Tenant.objects.create(slug=tenant.slug, name="dup")

    post_save.connect(listener, sender=ToolCall)
    try:
        with pytest.raises(IntegrityError):
            tools._insert_new(_ledger_row(thread, "k-1"), _ledger_event(thread, "k-1"))
    finally:
        post_save.disconnect(listener, sender=ToolCall)
    assert not ToolCall.objects.filter(idempotency_key="k-1").exists()
    assert not AuditEvent.objects.filter(
        thread_id=thread.thread_id, kind="tool_call.started"
    ).exists()


def test_a_gates_request_and_its_decision_are_saved_by_model_save_when_someone_listens():
    """approvals.services: the request opened once per interrupt (a second
    opening writes nothing) and the decision that settles it, through
    Model.save where their post_save has receivers, with their events."""
    from langgraph.types import Interrupt

    from approvals.content import payload_of
    from approvals.models import ApprovalRequest, Decision
    from approvals.services import Reviewer, approval_decide, approval_requests_open
    from tests.approvals.helpers import waiting_request
    from tests.factories import make_member

    tenant = make_tenant()
    heard = []

    def listener(sender, instance, created, **kwargs):
        heard.append((sender.__name__, created))

    for model in (ApprovalRequest, Decision):
        post_save.connect(listener, sender=model)
    try:
        request = waiting_request(tenant)
        again = approval_requests_open(
            run=request.run,
            interrupts=[Interrupt(value=payload_of(request), id=request.interrupt_id)],
        )
        assert again == []  # still waiting: nothing written
        reviewer = make_member(tenant, role="reviewer", username="rita").user
        settled, resumed = approval_decide(
            approval=request, reviewer=Reviewer.for_user(reviewer), approved=True
        )
    finally:
        for model in (ApprovalRequest, Decision):
            post_save.disconnect(listener, sender=model)
    assert ("ApprovalRequest", True) in heard and ("Decision", True) in heard
    assert heard.count(("ApprovalRequest", True)) == 1
    assert ApprovalRequest.objects.filter(thread=request.thread).count() == 1
    assert settled.status == "approved" and settled.decisions.count() == 1
    assert resumed.status == Run.Status.QUEUED
    kinds = list(
        AuditEvent.objects.filter(thread_id=request.thread.thread_id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds.count("approval.requested") == 1
    assert kinds[-2:] == ["approval.decided", "run.queued"]
