"""The discovery interval is `discovery_interval_seconds`; the name it had before the fleet side
said "discovery" (`refresh_interval_seconds`) is still accepted on input, and answers carry the
new name only."""

import pytest

from controlplane.fleet.models import Source

pytestmark = pytest.mark.django_db


def create(client, **fields) -> dict:
    body = {"name": "named", "listener_url": "http://127.0.0.1:9/", **fields}
    body.setdefault("allowed_networks", ["127.0.0.0/8"])
    response = client.post("/api/v1/sources", body, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()


@pytest.mark.parametrize("name", ["discovery_interval_seconds", "refresh_interval_seconds"])
def test_the_interval_is_set_under_either_name(admin_client, name):
    answer = create(admin_client, **{name: 42})
    assert answer["discovery_interval_seconds"] == 42
    assert "refresh_interval_seconds" not in answer
    assert Source.objects.get(name="named").discovery_interval_seconds == 42


def test_a_patch_under_the_old_name_changes_it(admin_client):
    create(admin_client)
    response = admin_client.patch(
        "/api/v1/sources/named", {"refresh_interval_seconds": 7}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert Source.objects.get(name="named").discovery_interval_seconds == 7
