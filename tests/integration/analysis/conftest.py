import pytest

from controlplane.fleet.models import Source


def cases(n: int) -> list[dict]:
    return [{"prompt": [100 + i, 7, 9], "continuation": [11, 12]} for i in range(n)]


def body(n: int = 20, **extra) -> dict:
    return {"prompts": cases(n), **extra}


@pytest.fixture
def source(db):
    return Source.objects.create(
        name="src-a", listener_url="http://127.0.0.1:9/", allowed_networks=["127.0.0.0/8"]
    )
