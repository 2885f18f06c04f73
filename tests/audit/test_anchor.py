"""Signed heads kept outside the database prove later that sealed history was
not rewritten, re-sealed or cut short: `audit_anchor`, `GET /audit/head`,
`verify_audit --against` and `POST /audit/verify`."""

import datetime
import io
import json

import pytest
from django.core.management import CommandError, call_command

from audit import sealing
from audit.models import AuditBlock, AuditVerification
from audit.services import purge_before
from runs.crypto import audit_keyring
from tests.audit.helpers import BASE_TIME, add_events, reseal, tamper
from tests.factories import api_client, make_api_key, make_tenant, tenant_with_client

pytestmark = pytest.mark.django_db
HEAD = "/api/v1/audit/head"
VERIFY = "/api/v1/audit/verify"


def anchor(*args: str) -> list[dict]:
    out = io.StringIO()
    call_command("audit_anchor", *args, stdout=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def verify_against(path, *args: str) -> str:
    out = io.StringIO()
    try:
        call_command("verify_audit", "--against", str(path), *args, stdout=out)
    except CommandError:
        return "EXIT 1\n" + out.getvalue()
    return out.getvalue()


def saved_heads(tmp_path, *tenants) -> str:
    path = tmp_path / "heads.jsonl"
    lines = [json.dumps(h) for t in tenants for h in anchor("--tenant", t.slug)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def sealed_tenant():
    tenant = make_tenant()
    add_events(tenant, 30)
    sealing.seal_all()
    add_events(tenant, 20)
    sealing.seal_all()
    return tenant


def test_audit_anchor_prints_the_signed_head_of_each_tenant(sealed_tenant):
    quiet = make_tenant()
    heads = {head["tenant"]: head for head in anchor()}
    assert set(heads) >= {sealed_tenant.slug, quiet.slug}
    head = heads[sealed_tenant.slug]
    last = AuditBlock.objects.for_tenant(sealed_tenant).order_by("-last_seq").first()
    assert (head["head_seq"], head["head_hash"]) == (51, last.block_hash)
    assert head["tenant_id"] == sealed_tenant.pk and head["key_id"] == "audit-1"
    assert len(head["signature"]) == 64
    # A tenant with nothing sealed yet starts from the genesis hash.
    assert (heads[quiet.slug]["head_seq"], heads[quiet.slug]["head_hash"]) == (
        0,
        sealing.GENESIS_HASH,
    )


def test_a_saved_head_holds_while_the_chain_grows(sealed_tenant, tmp_path):
    heads = saved_heads(tmp_path, sealed_tenant)
    add_events(sealed_tenant, 10)
    sealing.seal_all()
    output = verify_against(heads)
    assert output == (
        f"{sealed_tenant.slug}: intact: 3 block(s), 61 event(s), 0 not sealed yet; "
        f"sealed through #61 (hash {sealing_head(sealed_tenant)}); "
        "holds the saved head #51\n"
    )
    assert AuditVerification.objects.for_tenant(sealed_tenant).get().against_seq == 51


def sealing_head(tenant) -> str:
    return (
        AuditBlock.objects.for_tenant(tenant).order_by("-last_seq").first().block_hash
    )


def test_a_rewrite_resealed_with_the_audit_key_is_caught(sealed_tenant, tmp_path):
    """Even someone holding the audit key cannot rewrite what a saved head
    covers: the chain no longer holds that block."""
    heads = saved_heads(tmp_path, sealed_tenant)
    tamper(
        "UPDATE audit_auditevent SET actor_label = 'someone-else' "
        "WHERE tenant_id = %s AND seq = 9",
        [sealed_tenant.pk],
    )
    reseal(sealed_tenant, key=audit_keyring().key("audit-1"), key_id="audit-1")
    assert sealing.verify_tenant(tenant_id=sealed_tenant.pk).ok
    output = verify_against(heads)
    assert output.startswith("EXIT 1\n")
    assert (
        f"{sealed_tenant.slug}: BROKEN at seq 32: block #32-51 is not the block of "
        "the saved head #51: history up to it was rewritten and sealed again"
    ) in output


def test_truncated_history_is_caught(sealed_tenant, tmp_path):
    """The last block and its events removed, the counters wound back: the
    chain alone still looks whole; the saved head does not."""
    heads = saved_heads(tmp_path, sealed_tenant)
    first = AuditBlock.objects.for_tenant(sealed_tenant).order_by("first_seq").first()
    for sql in (
        "DELETE FROM audit_auditevent WHERE tenant_id = %s AND seq > 31",
        "DELETE FROM audit_auditblock WHERE tenant_id = %s AND first_seq = 32",
        "UPDATE audit_auditsequence SET last_seq = 31 WHERE tenant_id = %s",
    ):
        tamper(sql, [sealed_tenant.pk])
    tamper(
        "UPDATE audit_auditchainhead SET last_seq = 31, block_hash = %s "
        "WHERE tenant_id = %s",
        [first.block_hash, sealed_tenant.pk],
    )
    assert sealing.verify_tenant(tenant_id=sealed_tenant.pk).ok
    output = verify_against(heads)
    assert (
        f"{sealed_tenant.slug}: BROKEN at seq 32: the sealed chain ends at #31, "
        "before the saved head #51: sealed history was removed"
    ) in output


def test_an_altered_saved_head_is_refused(sealed_tenant, tmp_path):
    heads = saved_heads(tmp_path, sealed_tenant)
    head = json.loads(heads.read_text())
    head["head_seq"] = 31  # to make a shorter history look vouched for
    heads.write_text(json.dumps(head))
    output = verify_against(heads)
    assert output.startswith("EXIT 1\n")
    assert "saved head refused: the saved head's signature does not verify" in output


def test_a_head_at_the_purge_boundary_holds_and_one_before_it_cannot(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(sealing, "MAX_BLOCK_EVENTS", 10)
    tenant = make_tenant()
    at = {"at": lambda seq: BASE_TIME + datetime.timedelta(days=seq)}
    add_events(tenant, 9, **at)
    sealing.seal_all()  # 1-10
    early = saved_heads(tmp_path, tenant).rename(tmp_path / "early.jsonl")
    add_events(tenant, 20, **at)
    sealing.seal_all()  # 11-20, 21-30
    purge_before(tenant=tenant, before=BASE_TIME + datetime.timedelta(days=15))
    # Through #10: the purge's record carries the seal the saved head copied.
    assert "holds the saved head #10" in verify_against(early)
    purge_before(tenant=tenant, before=BASE_TIME + datetime.timedelta(days=25))
    assert (
        f"{tenant.slug}: BROKEN at seq 10: the saved head #10 was purged by "
        "retention (through #20)"
    ) in verify_against(early)


# --- The API --------------------------------------------------------------------


def test_the_head_endpoint_serves_the_signed_head_to_audit_readers():
    tenant, client = tenant_with_client(scopes=["audit"])
    add_events(tenant, 5)
    sealing.seal_all()
    body = client.get(HEAD).json()
    assert body["tenant"] == tenant.slug and body["head_seq"] == 7  # with 2 of its own
    assert body["head_hash"] == sealing_head(tenant)
    _, runs_only = tenant_with_client(scopes=["runs"])
    assert runs_only.get(HEAD).status_code == 403


def test_posting_a_saved_head_checks_the_chain_against_it(sealed_tenant):
    _, secret = make_api_key(sealed_tenant, ["audit"])
    client = api_client(secret)
    head = client.get(HEAD).json()
    body = client.post(VERIFY, {"against": head}, format="json").json()
    assert body["ok"] is True and body["against_seq"] == 51
    tamper(
        "UPDATE audit_auditevent SET summary = 'refund of 4.00' "
        "WHERE tenant_id = %s AND seq = 40",
        [sealed_tenant.pk],
    )
    reseal(sealed_tenant, key=audit_keyring().key("audit-1"), key_id="audit-1")
    body = client.post(VERIFY, {"against": head}, format="json").json()
    assert body["ok"] is False and body["first_bad_seq"] == 32
    assert "rewritten and sealed again" in body["problem"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"signature": "0" * 64}, "against.signature"),
        ({"head_seq": "51"}, "against.head_seq"),
        ({"key_id": "gone"}, "against.key_id"),
        ({"signed_at": "yesterday"}, "against.signed_at"),
    ],
)
def test_a_bad_saved_head_is_400_naming_the_field(change, field):
    tenant, client = tenant_with_client(scopes=["audit"])
    head = {**client.get(HEAD).json(), **change}
    response = client.post(VERIFY, {"against": head}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]


def test_another_tenants_saved_head_is_refused():
    _, client = tenant_with_client(scopes=["audit"])
    _, other = tenant_with_client(scopes=["audit"])
    response = client.post(VERIFY, {"against": other.get(HEAD).json()}, format="json")
    assert response.status_code == 400
    assert "against.tenant" in response.json()["fields"]
    assert client.post(VERIFY, {}, format="json").status_code == 400


def test_the_head_endpoint_answers_409_when_the_last_block_was_altered(
    sealed_tenant,
):
    _, secret = make_api_key(sealed_tenant, ["audit"])
    tamper(
        "UPDATE audit_auditblock SET events_hash = md5('x') || md5('y') "
        "WHERE tenant_id = %s AND first_seq = 32",
        [sealed_tenant.pk],
    )
    response = api_client(secret).get(HEAD)
    assert response.status_code == 409
    assert response.json()["code"] == "audit_chain_broken"
