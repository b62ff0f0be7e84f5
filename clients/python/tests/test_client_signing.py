"""Standard Webhooks signing as the control plane verifies it, including key rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from dynamo_rl_trainer import Signer, sign

OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()


def test_the_signature_is_hmac_sha256_of_id_timestamp_and_body():
    body = b'{"type":"test.ping","data":{}}'
    expected = hmac.new(b"o" * 32, b"msg_1.1700000000." + body, hashlib.sha256).digest()
    assert sign(OLD, "msg_1", 1700000000, body) == "v1," + base64.b64encode(expected).decode()


def test_the_standard_webhooks_reference_vector():
    # The test vector the Standard Webhooks reference libraries share.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    signature = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_rotating_signer_signs_with_every_secret_in_order():
    signer = Signer(OLD).rotated(NEW)
    headers = signer.headers(b"{}", webhook_id="msg_2", timestamp=1700000000)
    assert headers["webhook-id"] == "msg_2"
    assert headers["webhook-timestamp"] == "1700000000"
    assert headers["webhook-signature"].split(" ") == [
        sign(OLD, "msg_2", 1700000000, b"{}"),
        sign(NEW, "msg_2", 1700000000, b"{}"),
    ]
    finished = signer.rotated(NEW, keep_old=False)
    assert finished.secrets == (NEW,)


@pytest.mark.parametrize(
    "secret",
    ["secret", "whsec_not base64!", "whsec_" + base64.b64encode(b"short").decode(), ""],
)
def test_a_bad_secret_is_refused_when_the_signer_is_built(secret):
    with pytest.raises(ValueError):
        Signer(secret or [])


def test_every_message_gets_its_own_id():
    signer = Signer(OLD)
    assert signer.headers(b"{}")["webhook-id"] != signer.headers(b"{}")["webhook-id"]
