"""Outbound notifications: destinations, deliveries, Standard Webhooks signing, the delivery
attempt and its Celery task.

A low-level app beside `audit`: feature apps (`fleet`, `refresh`) and the top layer (`intake`)
call `controlplane.notify.emit.notify`; notify imports none of them. Its destinations refer to
`fleet.Source` only by name in the foreign key, and it records its own audit rows.
"""
