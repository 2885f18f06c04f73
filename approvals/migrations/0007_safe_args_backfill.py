"""Fills `safe_args` (0006) for the requests opened before it, so that the
queue's search finds them by order id too.

Each payload is decrypted as approvals.content.payload_of does, under the
master key ring in settings; a request whose edit was decided is shown by the
arguments it would now execute, as approvals.services.decisions keeps it.
Skipped, never an error: a thread whose agent/version is no longer registered,
a shredded thread (its data key is gone), a payload already cleared with the
thread's content or that does not decrypt. Such requests keep "" and are
found by thread id and action, as before.
"""

import sys

from django.core.exceptions import ImproperlyConfigured
from django.db import migrations

from approvals.content import decision_row, payload_row
from approvals.queue import safe_args_text
from runs import registry
from runs.crypto import CryptoError, ThreadCipher

BATCH = 500


def _declared_safe(thread, known: dict) -> frozenset[str] | None:
    """The agent's declared safe arguments; None when it is not registered."""
    key = (thread.agent_name, thread.agent_version)
    if key not in known:
        try:
            known[key] = registry.get(*key).safe_args
        except (registry.UnknownAgent, ImproperlyConfigured):
            known[key] = None
    return known[key]


def _last_edits(decisions, batch) -> dict:
    """The last decision that edited the arguments, by request pk."""
    rows = decisions.filter(
        request__in=[request.pk for request in batch], args_edited=True
    ).order_by("created_at")
    return {decision.request_id: decision for decision in rows}


def _args(request, edit) -> dict:
    """What the request would now execute: the last edit, else the payload's
    arguments. CryptoError (shredded thread, cleared content) or KeyError (a
    master key no longer in the ring) when they cannot be read."""
    cipher = ThreadCipher.for_thread(request.thread)
    if edit is not None:
        return cipher.decrypt_value(edit.detail, row=decision_row(edit))["args"]
    return cipher.decrypt_value(request.payload, row=payload_row(request))["args"]


def _filled(batch, decisions, known: dict) -> tuple[list, int]:
    """The requests of `batch` given their safe arguments (the others left),
    and how many of those left were sealed under a master key not in the
    ring."""
    readable = [
        request
        for request in batch
        if request.payload and _declared_safe(request.thread, known)
    ]
    edits = _last_edits(decisions, readable)
    filled, missing_key = [], 0
    for request in readable:
        try:
            args = _args(request, edits.get(request.pk))
        except CryptoError:
            continue  # shredded thread, content cleared or altered
        except KeyError:
            missing_key += 1
            continue
        request.safe_args = safe_args_text(args, _declared_safe(request.thread, known))
        if request.safe_args:
            filled.append(request)
    return filled, missing_key


def backfill(apps, schema_editor) -> None:
    db = schema_editor.connection.alias
    requests = apps.get_model("approvals", "ApprovalRequest").objects.using(db)
    decisions = apps.get_model("approvals", "Decision").objects.using(db)
    todo = requests.filter(safe_args="").select_related("thread").order_by("pk")
    known: dict = {}
    # Batches by primary key rather than one open cursor: the rows written
    # leave the filter, and SQLite does not isolate a cursor from the writes
    # of its own connection.
    last, missing_key = None, 0
    while True:
        page = todo if last is None else todo.filter(pk__gt=last)
        batch = list(page[:BATCH])
        if not batch:
            break
        last = batch[-1].pk
        filled, missing = _filled(batch, decisions, known)
        requests.bulk_update(filled, ["safe_args"])
        missing_key += missing
    if missing_key:
        # A migration has no other channel to the operator running it.
        sys.stdout.write(
            f"\n  {missing_key} approval request(s) belong to threads whose key "
            "is wrapped by a master key not in GATEHOUSE_MASTER_KEYS: they keep "
            "no safe arguments in clear. Put the key back in the ring, then run "
            "`manage.py migrate approvals 0006` and `manage.py migrate`.\n"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0006_safe_args"),
        # Thread data keys in the format ThreadCipher unwraps.
        ("runs", "0015_data_keys_bound_to_threads"),
    ]

    # Going back keeps the filled values: 0006's column holds them as well.
    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
