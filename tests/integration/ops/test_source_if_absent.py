"""The compose `sim` profile registers its source on every start: the second time is a no-op."""

from io import StringIO

import pytest
from django.core.management import call_command

from controlplane.audit.models import AuditEvent
from controlplane.fleet.models import Source

pytestmark = pytest.mark.django_db
ARGS = ("source", "add", "sim", "--listener-url", "http://10.0.0.5:8001")


def test_add_if_absent_twice_creates_one_source_and_one_audit_row():
    call_command(*ARGS, "--admin-network", "10.0.0.0/24", "--if-absent", stdout=StringIO())
    out = StringIO()
    call_command(*ARGS, "--admin-network", "172.16.0.0/12", "--if-absent", stdout=out)
    assert "exists; left as it is" in out.getvalue()
    assert Source.objects.get().allowed_networks == ["10.0.0.0/24"]
    assert AuditEvent.objects.filter(action="source.created").count() == 1
