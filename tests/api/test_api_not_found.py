"""A path under /api/ that no route matches answers the API's JSON error, never an HTML page
(schemathesis found one: a version with a line break, which Django's path converter refuses)."""

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path", ["/api/v1/versions/a%0Ab/provenance", "/api/v1/no-such-thing", "/api/v2/gates"]
)
def test_an_unmatched_api_path_answers_json(viewer_client, path):
    response = viewer_client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"


def test_an_unmatched_page_path_still_answers_the_page(viewer_client):
    response = viewer_client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
