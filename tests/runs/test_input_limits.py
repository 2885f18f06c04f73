"""What no view can cope with is refused at the API's boundary with a 400
naming where it is, and a stored value JSON cannot hold never makes a read
answer 500 (issue 16, finding 3)."""

import json

import pytest

from runs.graphs import compile_for, thread_config
from runs.models import Run, Thread
from tests.approvals.helpers import waiting_request
from tests.factories import tenant_with_client

pytestmark = pytest.mark.django_db


def post_raw(client, path: str, text: str):
    return client.post(path, data=text, content_type="application/json")


def fields_of(response) -> dict:
    assert response.status_code == 400, response.content
    return response.json().get("fields", {})


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_json_nested_a_thousand_deep_is_a_400():
    _, client = tenant_with_client()
    body = f'{{"agent": "echo", "metadata": {nested(1000)}}}'
    response = post_raw(client, "/api/v1/threads", body)
    assert response.status_code == 400
    assert response.json()["code"] in {"parse_error", "invalid"}


def test_json_deeper_than_the_limit_is_a_400_naming_where():
    _, client = tenant_with_client()
    body = f'{{"agent": "echo", "metadata": {nested(40)}}}'
    (where,) = fields_of(post_raw(client, "/api/v1/threads", body))
    # The container at depth 32 (the body is depth 0) is named.
    assert where == "metadata" + ".a" * 31


@pytest.mark.parametrize("number", ["1e400", "-1e400", "NaN", "Infinity"])
def test_a_number_that_is_not_finite_is_a_400_naming_the_field(number):
    tenant, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    body = f'{{"input": {{"order": {{"id": "A-1", "amount": {number}}}}}}}'
    fields = fields_of(post_raw(client, "/api/v1/threads/t1/runs", body))
    assert fields == {
        "input.order.amount": ["input.order.amount must be a finite number."]
    }


@pytest.mark.parametrize("number", [2**63, -(2**63) - 1, 10**30])
def test_an_integer_beyond_64_bits_is_a_400_naming_the_field(number):
    _, client = tenant_with_client()
    body = json.dumps({"agent": "echo", "metadata": {"items": [1, {"n": number}]}})
    fields = fields_of(post_raw(client, "/api/v1/threads", body))
    assert list(fields) == ["metadata.items[1].n"]


def test_the_largest_64_bit_integers_are_accepted():
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    body = json.dumps({"input": {"hi": 2**63 - 1, "lo": -(2**63)}})
    assert post_raw(client, "/api/v1/threads/t1/runs", body).status_code == 202


def test_a_stored_value_json_cannot_hold_reads_as_unreadable():
    """An agent of its own can still store infinity: the state and the thread
    read, with that one value shown as unreadable."""
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    Thread.objects.filter(thread_id="t1").update(agent_version="1")  # as if it ran
    thread = Thread.objects.get(thread_id="t1")
    compile_for(thread).update_state(
        thread_config(thread), {"text": float("inf"), "echoed": "ok"}, as_node="echo"
    )
    state = client.get("/api/v1/threads/t1/state")
    assert state.status_code == 200, state.content
    assert state.json()["values"] == {
        "text": {"unreadable": "not a finite number"},
        "echoed": "ok",
    }
    assert client.get("/api/v1/threads/t1").status_code == 200


@pytest.mark.parametrize(
    "value", [{"customer": {"email": "rita@example.com"}}, ["A-1", "A-2"], "x" * 201]
)
def test_a_declared_safe_metadata_key_holds_a_short_scalar_only(value):
    """Issue 16, finding 12: safe-declared metadata is kept in clear after the
    thread is shredded, so it may not carry an object, a list or a text."""
    _, client = tenant_with_client()
    body = {"agent": "refund", "metadata": {"order_id": value}}
    response = client.post("/api/v1/threads", body, format="json")
    assert "must be a string of at most 200" in fields_of(response)["metadata"][0]
    body["metadata"]["order_id"] = "A-1001"
    assert client.post("/api/v1/threads", body, format="json").status_code == 201


@pytest.mark.parametrize("number", [2**64, -(2**64)])
def test_an_integer_beyond_64_bits_in_a_run_input_is_a_400_naming_it(number):
    _, client = tenant_with_client()
    client.post("/api/v1/threads", {"thread_id": "t1", "agent": "echo"}, format="json")
    body = json.dumps({"input": {"order": {"amount": number}}})
    fields = fields_of(post_raw(client, "/api/v1/threads/t1/runs", body))
    assert list(fields) == ["input.order.amount"]
    assert not Run.objects.exists()


@pytest.mark.parametrize("number", ["1e400", str(2**64)])
def test_a_decisions_args_out_of_range_are_a_400_and_decide_nothing(number):
    """The finding's decision args: refused before the request is looked at,
    and it stays pending."""
    tenant, client = tenant_with_client()
    approval = waiting_request(tenant)
    body = f'{{"approved": true, "note": "ok", "args": {{"amount": {number}}}}}'
    path = f"/api/v1/approvals/{approval.pk}/decision"
    assert list(fields_of(post_raw(client, path, body))) == ["args.amount"]
    approval.refresh_from_db()
    assert approval.status == "pending" and not approval.decisions.exists()


def test_the_refund_agent_never_stores_an_amount_of_1e400():
    """The finding's path: `amount: 1e400` through the refund agent. It is
    refused at the boundary, so nothing odd is stored for later reads."""
    tenant, client = tenant_with_client()
    client.post(
        "/api/v1/threads", {"thread_id": "case-1", "agent": "refund"}, format="json"
    )
    body = (
        '{"input": {"customer_message": "refund please", '
        '"order": {"id": "A-1", "amount": 1e400, "currency": "EUR"}}}'
    )
    fields = fields_of(post_raw(client, "/api/v1/threads/case-1/runs", body))
    assert list(fields) == ["input.order.amount"]
    assert not Run.objects.exists()
    assert client.get("/api/v1/threads/case-1").status_code == 200
    # No run, no checkpoint: the state is not found, as for any new thread.
    assert client.get("/api/v1/threads/case-1/state").status_code == 404


# --- the body's charset: UTF-8 only (RFC 8259 §8.1) ----------------------------------

THREAD_CREATES = [
    ("/api/v1/threads", {"thread_id": "case-1", "agent": "echo"}),
    ("/langgraph/threads", {"thread_id": "case-1"}),
]


@pytest.mark.parametrize("path,body", THREAD_CREATES)
@pytest.mark.parametrize("codec", ["bz2", "zlib_codec", "base64", "hex", "quopri"])
def test_a_body_declared_in_a_compressing_codec_is_415_and_never_inflated(
    path, body, codec
):
    """Python's codecs by these names decompress or unwrap bytes: the body
    below, a valid thread create once decoded, was created from a few hundred
    bytes sent (a bz2 bomb inflated to 858 MB past the 1 MB limit). It is
    refused before anything is decoded, on both APIs."""
    import codecs

    tenant, client = tenant_with_client()
    packed = codecs.encode(json.dumps(body).encode(), codec)
    response = client.generic(
        "POST", path, packed, content_type=f"application/json; charset={codec}"
    )
    assert response.status_code == 415, response.content
    error = response.json()
    assert error["code"] == "unsupported_media_type"
    assert f'charset "{codec}"' in error["message"] and "UTF-8" in error["message"]
    assert not Thread.objects.filter(tenant=tenant).exists()


@pytest.mark.parametrize("path,body", THREAD_CREATES)
@pytest.mark.parametrize(
    "charset", ["rot13", "utf-16", "utf-32", "latin-1", "idna", "unicode_escape", "x"]
)
def test_a_body_declared_in_another_text_charset_is_415(path, body, charset):
    """rot13 and the like answered 500; a text charset other than UTF-8 was
    decoded with it. JSON is UTF-8: any other is refused by its name."""
    tenant, client = tenant_with_client()
    response = client.generic(
        "POST",
        path,
        json.dumps(body).encode(),
        content_type=f"application/json; charset={charset}",
    )
    assert response.status_code == 415, response.content
    assert response.json()["code"] == "unsupported_media_type"
    assert not Thread.objects.filter(tenant=tenant).exists()


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=UTF-8",
        'application/json; charset="utf-8"',
        "application/json;charset=utf8",
        "application/json; charset=UTF8",
    ],
)
def test_a_utf8_body_is_read_with_or_without_its_charset(content_type):
    tenant, client = tenant_with_client()
    body = '{"thread_id": "caf\u00e9-1", "agent": "echo"}'
    response = client.generic(
        "POST", "/api/v1/threads", body.encode(), content_type=content_type
    )
    # "café-1" is no thread id: the body was read, and its id checked.
    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == ["thread_id"]
    ok = '{"thread_id": "t-1", "agent": "refund", "metadata": {"order_id": "\u00e9-1"}}'
    response = client.generic(
        "POST", "/api/v1/threads", ok.encode(), content_type=content_type
    )
    assert response.status_code == 201, response.content
    assert response.json()["metadata"] == {"order_id": "\u00e9-1"}


def test_a_body_that_is_not_utf8_is_a_400():
    """Latin-1 bytes under no charset (or utf-8): a parse error, not read in
    another encoding."""
    _, client = tenant_with_client()
    body = '{"agent": "echo", "metadata": {"n": "\u00e9"}}'.encode("latin-1")
    response = client.generic(
        "POST", "/api/v1/threads", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"


# --- lone surrogates: a \u escape JSON can spell, no character ----------------------

LONE = "x\ud800y"  # json.dumps writes it as "x\ud800y", json.loads reads it back


def lone_surrogate_bodies(thread_id: str):
    """(path, body, the field named): each answered 500 before (a DataError
    storing metadata, a TypeError hashing a resume key, a 400 echoing a
    choice its renderer then failed on)."""
    yield "/api/v1/threads", {"agent": "refund", "metadata": {"order_id": LONE}}, (
        "metadata.order_id"
    )
    yield "/api/v1/threads", {"agent": "refund", "metadata": {LONE: "x"}}, (
        "metadata.x\\ud800y"
    )
    yield f"/api/v1/threads/{thread_id}/resume", {"resume": {LONE: LONE}}, (
        "resume.x\\ud800y"
    )
    for field in ("multitask_strategy", "if_not_exists", "on_disconnect", "durability"):
        yield (
            f"/langgraph/threads/{thread_id}/runs",
            {"assistant_id": "refund", field: LONE},
            field,
        )
    yield "/langgraph/threads", {"metadata": {"a": [1, {"b": "\udfff"}]}}, (
        "metadata.a[1].b"
    )


def test_a_lone_surrogate_anywhere_in_a_body_is_a_400_naming_it():
    tenant, client = tenant_with_client()
    approval = waiting_request(tenant)
    thread_id = approval.thread.thread_id
    threads, runs = Thread.objects.count(), Run.objects.count()
    for path, body, field in lone_surrogate_bodies(thread_id):
        response = post_raw(client, path, json.dumps(body))
        assert fields_of(response) == {
            field: [
                f"{field} holds a lone surrogate (an unpaired \\ud800-\\udfff "
                "escape), which is no character."
            ]
        }, path
    assert (Thread.objects.count(), Run.objects.count()) == (threads, runs)


def test_surrogate_pairs_and_escaped_backslashes_are_read():
    """A pair is one character (an emoji); "\\\\ud800" is a backslash and text."""
    _, client = tenant_with_client()
    body = '{"agent": "refund", "metadata": {"order_id": "\\ud83d\\ude00 \\\\ud800"}}'
    response = post_raw(client, "/api/v1/threads", body)
    assert response.status_code == 201, response.content
    assert response.json()["metadata"] == {"order_id": "\U0001f600 \\ud800"}


def test_the_renderer_escapes_a_lone_surrogate_it_cannot_encode():
    """What the parser refuses can still come from an agent's own output:
    rendered \\u-escaped (valid JSON) instead of a UnicodeEncodeError, with
    the rest as it is (a non-finite number as unreadable)."""
    from agent_protocol.views.base import EventStreamRenderer, StreamingView
    from runs.api.parsers import SafeJSONRenderer

    data = {"text": "x\ud800", "\udc00": [float("inf"), "\u00e9"]}
    for renderer in (SafeJSONRenderer(), EventStreamRenderer()):
        assert json.loads(renderer.render(data)) == {
            "text": "x\ud800",
            "\udc00": [{"unreadable": "not a finite number"}, "\u00e9"],
        }
    assert all(
        issubclass(renderer, SafeJSONRenderer)
        for renderer in StreamingView.renderer_classes
    )
