"""Beat's operations tasks: the retention purge and the heartbeat `doctor` reads."""

from __future__ import annotations

from celery import shared_task

from controlplane.audit.recorder import Actor
from controlplane.ops import heartbeat, retention


@shared_task(name="ops.purge_expired", ignore_result=True)
def purge_expired() -> dict[str, int]:
    reports = retention.purge(actor=Actor.system("retention"))
    return {report.name: report.rows for report in reports}


@shared_task(name="ops.beat_heartbeat", ignore_result=True)
def beat_heartbeat() -> None:
    heartbeat.touch()
