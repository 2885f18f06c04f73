"""runs.storage: shredding, deleting and pruning thread content."""

import pytest

from runs import crypto, storage
from runs.checkpointer import DjangoSaver
from runs.crypto import ThreadCipher, ThreadDeleted
from runs.models import ChannelBlob, Checkpoint, PendingWrite, Thread
from tests.factories import make_tenant, stored_cipher
from tests.runs.test_checkpointer import LONG, put_checkpoint, thread_config

pytestmark = pytest.mark.django_db

ROW = ("run-input", "run-1")


def make_thread(tenant=None, thread_id="case-1") -> Thread:
    return Thread.objects.create_with_data_key(
        tenant=tenant or make_tenant(), thread_id=thread_id
    )


def test_a_shredded_thread_is_a_tombstone_whose_content_cannot_be_decrypted():
    thread = make_thread()
    blob = ThreadCipher.for_thread(thread).encrypt_value("secret", row=ROW)

    storage.threads_shred(thread_pks=[thread.pk])

    stored = Thread.objects.get(pk=thread.pk)
    assert stored.wrapped_data_key is None and stored.deleted_at is not None
    with pytest.raises(ThreadDeleted, match="data key was destroyed"):
        stored_cipher(thread.pk).decrypt_value(blob, row=ROW)


def test_shredding_evicts_the_cached_key():
    thread = make_thread()
    ThreadCipher.for_thread(thread)
    assert any(key[0] == thread.pk for key in crypto.keyring().data_keys)
    storage.threads_shred(thread_pks=[thread.pk])
    assert not any(key[0] == thread.pk for key in crypto.keyring().data_keys)


def test_a_batch_with_a_thread_under_legal_hold_is_not_shredded_at_all():
    tenant = make_tenant()
    free, held = make_thread(tenant, "free"), make_thread(tenant, "held")
    Thread.objects.filter(pk=held.pk).update(legal_hold=True)

    with pytest.raises(storage.ThreadUnderLegalHold, match="held"):
        storage.threads_shred(thread_pks=[free.pk, held.pk])

    assert not Thread.objects.filter(wrapped_data_key__isnull=True).exists()


def test_destroying_a_thread_goes_by_row_not_by_id():
    """A deletion request shreds and tombstones first, removes rows later; by
    then a new thread may hold the client's id, and must be left alone."""
    tenant = make_tenant()
    put_checkpoint(DjangoSaver(tenant=tenant), "a", {"text": LONG + "old"})
    old = Thread.objects.get()
    storage.threads_shred(thread_pks=[old.pk])
    Thread.objects.create_with_data_key(tenant=tenant, thread_id="a")
    put_checkpoint(DjangoSaver(tenant=tenant), "a", {"text": "new"})

    removed = storage.thread_destroy(thread=old)

    assert removed == {"checkpoints": 1, "channel_blobs": 1}
    assert not Checkpoint.objects.filter(thread=old).exists()
    assert not ChannelBlob.objects.filter(thread=old).exists()
    new = DjangoSaver(tenant=tenant).get_tuple(thread_config("a"))
    assert new.checkpoint["channel_values"] == {"text": "new"}


def test_pruning_keeps_the_latest_n_with_their_writes_and_blobs():
    saver = DjangoSaver(tenant=make_tenant())
    first = put_checkpoint(saver, "a", {"text": LONG + "1"})
    saver.put_writes(first, [("text", "pending 1")], "task-1")
    second = put_checkpoint(saver, "a", {"text": LONG + "2"}, parent=first)
    third = put_checkpoint(saver, "a", {"text": LONG + "3"}, parent=second)
    saver.put_writes(third, [("text", "pending 3")], "task-3")
    thread = Thread.objects.get()

    removed = storage.checkpoints_prune(thread_pks=[thread.pk], keep=2)

    assert removed == {
        thread.pk: {"checkpoints": 1, "pending_writes": 1, "channel_blobs": 1}
    }
    kept = Checkpoint.objects.order_by("checkpoint_id")
    assert [c.checkpoint_id for c in kept] == [
        second["configurable"]["checkpoint_id"],
        third["configurable"]["checkpoint_id"],
    ]
    assert kept[0].parent_checkpoint_id == ""  # its parent is gone
    assert PendingWrite.objects.count() == 1
    latest = saver.get_tuple(thread_config("a"))
    assert latest.checkpoint["channel_values"] == {"text": LONG + "3"}
    assert latest.pending_writes == [("task-3", "text", "pending 3")]


def test_a_tombstone_keeps_its_deletion_time_when_shredded_again():
    thread = make_thread()
    storage.threads_shred(thread_pks=[thread.pk])
    first = Thread.objects.get(pk=thread.pk).deleted_at

    storage.threads_shred(thread_pks=[thread.pk], clear_metadata=True)

    assert Thread.objects.get(pk=thread.pk).deleted_at == first is not None


def test_every_model_that_stores_thread_ciphertext_declares_it():
    """Removing a thread clears what the models declare; a model that stores
    thread ciphertext without declaring it would keep it."""
    from django.apps import apps
    from django.db import models

    not_thread_content = {
        # The checkpoint store's own tables and the key: content_delete and
        # threads_shred handle them.
        Thread: {"wrapped_data_key"},
        Checkpoint: {"checkpoint", "metadata"},
        ChannelBlob: {"value"},
        PendingWrite: {"value"},
        # Digests of sealed audit events, not content.
        apps.get_model("audit", "AuditBlock"): {"leaves"},
        # A tenant's webhook signing key, wrapped like a thread's data key.
        apps.get_model("webhooks", "WebhookSubscription"): {"wrapped_secret"},
    }
    undeclared = {}
    for model in apps.get_models():
        declarations = getattr(model, "thread_content", ())
        if any(not content.fields for content in declarations):
            continue  # its rows are the content: deleted whole
        binary = {
            field.name
            for field in model._meta.concrete_fields
            if isinstance(field, models.BinaryField)
        }
        declared = {name for content in declarations for name in content.fields}
        missing = binary - declared - not_thread_content.get(model, set())
        if missing:
            undeclared[model._meta.label] = sorted(missing)
    assert undeclared == {}
