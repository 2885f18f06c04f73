"""runs.crypto: data keys, thread ciphertext bound to its row, compression."""

import dataclasses
import hashlib
import pickle

import pytest
import zstandard

from runs import crypto
from runs.crypto import NotCiphertext, TamperedCiphertext, ThreadCipher
from runs.models import Thread
from runs.serde import DisallowedType, StrictSerializer, UnknownEncoding
from tests.factories import make_tenant

pytestmark = pytest.mark.django_db

ROW = ("run-input", "run-1")


def make_thread(tenant=None, thread_id="case-1") -> Thread:
    return Thread.objects.create_with_data_key(
        tenant=tenant or make_tenant(), thread_id=thread_id
    )


@dataclasses.dataclass
class Refund:
    order_id: str
    amount: int


def test_value_round_trips_under_its_row():
    cipher = ThreadCipher.for_thread(make_thread())
    blob = cipher.encrypt_value({"text": "hello", "n": 3}, row=ROW)
    assert cipher.decrypt_value(blob, row=ROW) == {"text": "hello", "n": 3}


def test_ciphertext_is_versioned_and_freshly_nonced():
    cipher = ThreadCipher.for_thread(make_thread())
    first = cipher.encrypt(b"same", row=ROW)
    second = cipher.encrypt(b"same", row=ROW)
    assert first[0] == crypto.FORMAT_V1 == second[0]
    assert first[1:13] != second[1:13]
    assert b"same" not in first


def test_ciphertext_moved_to_another_row_fails():
    cipher = ThreadCipher.for_thread(make_thread())
    blob = cipher.encrypt_value("secret", row=("run-input", "run-1"))
    with pytest.raises(TamperedCiphertext, match="failed authentication"):
        cipher.decrypt_value(blob, row=("run-input", "run-2"))
    with pytest.raises(TamperedCiphertext):
        cipher.decrypt_value(blob, row=("tool-result", "run-1"))


def test_ciphertext_moved_to_another_thread_fails():
    tenant = make_tenant()
    source = ThreadCipher.for_thread(make_thread(tenant, "case-1"))
    other = ThreadCipher.for_thread(make_thread(tenant, "case-2"))
    blob = source.encrypt_value("secret", row=ROW)
    with pytest.raises(TamperedCiphertext):
        other.decrypt_value(blob, row=ROW)


def test_ciphertext_moved_to_another_tenant_fails_even_with_the_same_key():
    thread = make_thread()
    cipher = ThreadCipher.for_thread(thread)
    blob = cipher.encrypt_value("secret", row=ROW)
    # The same data key, claimed by a thread of another tenant with the same pk.
    impostor = ThreadCipher(
        tenant_id=thread.tenant_id + 1, thread_pk=thread.pk, aead=cipher._aead
    )
    with pytest.raises(TamperedCiphertext):
        impostor.decrypt_value(blob, row=ROW)


@pytest.mark.parametrize("position", [0, 1, 12, 13, -1])
def test_a_flipped_byte_fails(position):
    cipher = ThreadCipher.for_thread(make_thread())
    blob = bytearray(cipher.encrypt_value("secret", row=ROW))
    blob[position] ^= 0x01
    with pytest.raises((TamperedCiphertext, NotCiphertext)):
        cipher.decrypt_value(bytes(blob), row=ROW)


@pytest.mark.parametrize(
    "stored",
    [b"", b"\x83\xa4text\xa5hello", pickle.dumps("hello"), b"\x01short"],
)
def test_plaintext_is_refused(stored):
    cipher = ThreadCipher.for_thread(make_thread())
    with pytest.raises(NotCiphertext, match="refusing to read it as plaintext"):
        cipher.decrypt_value(stored, row=ROW)


def test_large_values_are_compressed_before_encryption():
    cipher = ThreadCipher.for_thread(make_thread())
    value = {"messages": ["the same sentence, again and again. "] * 500}
    blob = cipher.encrypt_value(value, row=ROW)
    assert len(blob) < len(StrictSerializer().dumps(value)) / 10
    assert cipher.decrypt_value(blob, row=ROW) == value


def _chat(messages: int) -> list[dict]:
    import random

    words = "refund order invoice customer shipping damaged status thanks".split()
    rng = random.Random(messages)
    return [
        {"role": "user", "content": " ".join(rng.choices(words, k=80))}
        for _ in range(messages)
    ]


def test_values_kept_long_compress_harder_and_read_alike(monkeypatch):
    cipher = ThreadCipher.for_thread(make_thread())
    value = _chat(100)
    usual = cipher.encrypt_value(value, row=ROW)
    compact = cipher.encrypt_value(value, row=ROW, compact=True)
    assert len(compact) < len(usual) * 0.95
    assert cipher.decrypt_value(compact, row=ROW) == value
    # Over the bound: the usual level, so a large one does not hold a step up.
    monkeypatch.setattr(crypto, "COMPACT_MAX_BYTES", 1000)
    assert len(crypto.encode_value(value, compact=True)) == len(
        crypto.encode_value(value)
    )


def test_large_values_compress_without_the_dictionary():
    """Over DICTIONARY_MAX_BYTES zstd alone (flag 0x40) compresses better at
    the compact level; below it the dictionary does. Both read alike."""
    cipher = ThreadCipher.for_thread(make_thread())
    large, small = _chat(200), _chat(2)
    assert len(StrictSerializer().dumps(large)) > crypto.DICTIONARY_MAX_BYTES
    assert crypto.encode_value(large, compact=True)[0] & 0xC0 == 0x40
    assert crypto.encode_value(small, compact=True)[0] & 0xC0 == 0x80
    for value in (large, small):
        sealed = cipher.encrypt_value(value, row=ROW, compact=True)
        assert cipher.decrypt_value(sealed, row=ROW) == value


def test_frames_are_stored_without_the_zstd_magic():
    """4 bytes a value less; frames written with it (before 2026-12-06) read
    as before, told apart by their first byte."""
    for value, codec in ((_chat(2), 0x80), (_chat(200), 0x40)):
        encoded = crypto.encode_value(value)
        assert encoded[0] & 0xC0 == codec
        assert encoded[1:5] != b"\x28\xb5\x2f\xfd"
        assert crypto.decode_value(encoded) == value
        with_magic = bytes((encoded[0],)) + b"\x28\xb5\x2f\xfd" + encoded[1:]
        assert crypto.decode_value(with_magic) == value


def test_the_earlier_write_format_keeps_the_zstd_magic(settings):
    """During a rolling upgrade from a release of 1-5 December 2026
    (GATEHOUSE_WRITE_FORMAT=2026-12-01) frames keep their magic number, which
    those releases need: they read a frame as zstd's default format does."""
    settings.GATEHOUSE_WRITE_FORMAT = "2026-12-01"
    for value, codec in ((_chat(2), 0x80), (_chat(200), 0x40)):
        encoded = crypto.encode_value(value)
        assert encoded[1:5] == b"\x28\xb5\x2f\xfd"
        body = crypto._decompressor(codec, magic=True).decompress(encoded[1:])
        assert body == StrictSerializer().dumps(value)[1:]
        assert crypto.decode_value(encoded) == value


def test_the_format_dictionary_never_changes():
    """Stored values need its exact bytes: a new dictionary is a new codec flag."""
    assert hashlib.sha256(crypto.FORMAT_DICTIONARY).hexdigest() == (
        "dd2c9651b5327c7e007aea7dca397124fedff0c81618194440a5c85dfb35d855"
    )


def test_values_compressed_without_the_dictionary_still_read():
    """Values written before the dictionary: zstd alone (flag 0x40)."""
    value = {"messages": ["the same sentence, again and again. "] * 500}
    encoded = StrictSerializer().dumps(value)
    old = bytes((encoded[0] | 0x40,)) + zstandard.ZstdCompressor(level=1).compress(
        encoded[1:]
    )
    assert crypto.decode_value(old) == value
    assert crypto.encode_value(value)[0] & 0xC0 == 0x80  # now: with the dictionary


def test_the_dictionary_shrinks_small_structured_values():
    checkpoint = {
        "v": 4,
        "ts": "2026-11-30T22:01:38.977492+00:00",
        "channel_versions": {
            "__start__": "00000000000000000000000000000002.0.804279202313459",
            "messages": "00000000000000000000000000000051.0.4467582150519571",
            "branch:to:speak": "00000000000000000000000000000051.0.4467582150519571",
        },
        "versions_seen": {
            "__input__": {},
            "__start__": {
                "__start__": "00000000000000000000000000000001.0.629698810775073"
            },
            "speak": {
                "branch:to:speak": "00000000000000000000000000000050.0.2229016554651657"
            },
        },
        "updated_channels": ["branch:to:speak", "messages"],
        "channel_values": {"branch:to:speak": None},
        "blob_channels": [],
    }
    encoded = StrictSerializer().dumps(checkpoint)
    alone = len(zstandard.ZstdCompressor(level=1).compress(encoded[1:]))
    assert len(crypto.encode_value(checkpoint)) < alone * 0.75
    assert crypto.decode_value(crypto.encode_value(checkpoint)) == checkpoint


def test_an_unknown_compression_flag_is_refused():
    """zstd (with or without the dictionary) is the one codec (a pinned
    dependency); any other flag is refused, never guessed at."""
    value = {"messages": ["the same sentence, again and again. "] * 500}
    encoded = crypto.encode_value(value)
    assert encoded[0] & 0xC0 == 0x80  # zstd with the dictionary
    with pytest.raises(crypto.CryptoError, match="unknown encoding byte"):
        crypto.decode_value(bytes((encoded[0] | 0x40,)) + encoded[1:])


def test_data_key_is_bound_to_its_tenant():
    thread = make_thread()
    with pytest.raises(TamperedCiphertext):
        crypto.unwrap_data_key(
            wrapped=thread.wrapped_data_key,
            key_id=thread.data_key_id,
            tenant_id=thread.tenant_id + 1,
            owner=crypto.thread_key_owner(thread.pk),
        )


def test_new_data_keys_are_wrapped_by_the_active_master_key():
    thread = make_thread()
    assert thread.data_key_id == crypto.keyring().active_id
    assert len(thread.wrapped_data_key) == 1 + 12 + 32 + 16


def test_strict_serializer_refuses_pickle_and_json_constructors():
    serializer = StrictSerializer()
    with pytest.raises(UnknownEncoding, match="no pickle"):
        serializer.loads_typed(("pickle", pickle.dumps("x")))
    with pytest.raises(UnknownEncoding):
        serializer.loads_typed(("json", b'{"lc": 2, "type": "constructor"}'))


def test_strict_serializer_refuses_types_outside_the_allow_list():
    serializer = StrictSerializer()
    stored = serializer.dumps({"refund": Refund("A-1", 40)})
    with pytest.raises(DisallowedType, match="test_crypto.Refund"):
        serializer.loads(stored)
    allowing = StrictSerializer(allowed_types=[Refund])
    assert allowing.loads(stored) == {"refund": Refund("A-1", 40)}


def test_strict_serializer_loads_langgraph_and_langchain_types():
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.types import Interrupt, Send

    serializer = StrictSerializer()
    value = [HumanMessage("hi"), AIMessage("hello"), Interrupt("ok?"), Send("n", 1)]
    assert serializer.loads(serializer.dumps(value)) == value
