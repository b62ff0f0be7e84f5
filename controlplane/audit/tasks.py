"""Beat task: append a signed checkpoint of the audit chain head (see anchors.py)."""

from celery import shared_task

from controlplane.audit.anchors import checkpoint_chain_head


@shared_task(name="audit.checkpoint_chain_head", ignore_result=True)
def checkpoint_chain_head_task() -> str:
    return checkpoint_chain_head().reason
