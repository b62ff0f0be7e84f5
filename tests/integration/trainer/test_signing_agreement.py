"""The library signs exactly as the server verifies (`controlplane.notify.signing`), including
while a key rotates: a delivery signed with the old and the new secret verifies against an
endpoint holding either, and the server's own signatures are the library's."""

from __future__ import annotations

import base64
import time

import pytest
from dynamo_rl_trainer import Signer, sign

from controlplane.notify import signing

OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
NEW = "whsec_" + base64.b64encode(b"n" * 48).decode()
BODY = b'{"type":"checkpoint.ready","data":{"weight_version":"step-1","model_path":"/c/1"}}'


@pytest.mark.parametrize("endpoint_holds", [[OLD], [NEW], [OLD, NEW]])
def test_a_rotating_signer_verifies_against_either_secret(endpoint_holds):
    headers = Signer([OLD, NEW]).headers(BODY)
    verified = signing.verify(endpoint_holds, headers, BODY, tolerance_seconds=300)
    assert verified.webhook_id == headers["webhook-id"]


def test_after_the_rotation_the_old_secret_alone_is_refused():
    headers = Signer(OLD).rotated(NEW, keep_old=False).headers(BODY)
    with pytest.raises(signing.VerificationError) as refused:
        signing.verify([OLD], headers, BODY, tolerance_seconds=300)
    assert refused.value.code == "bad_signature"


def test_a_changed_body_is_refused():
    headers = Signer(NEW).headers(BODY)
    with pytest.raises(signing.VerificationError):
        signing.verify([NEW], headers, BODY + b" ", tolerance_seconds=300)


def test_the_library_and_the_server_compute_the_same_signature():
    now = int(time.time())
    assert sign(NEW, "msg_x", now, BODY) == signing.sign(NEW, "msg_x", now, BODY)
    assert Signer([OLD, NEW]).headers(BODY, webhook_id="msg_x", timestamp=now) == (
        signing.sign_headers([OLD, NEW], "msg_x", BODY, timestamp=now)
    )
