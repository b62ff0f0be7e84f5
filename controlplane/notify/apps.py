from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "controlplane.notify"
    label = "notify"
    verbose_name = "Outbound notifications"

    def ready(self) -> None:
        # audit announces each checkpoint with a signal rather than calling notify, because
        # notify records its own audit rows: the arrow runs notify -> audit, never back.
        from controlplane.audit.anchors import checkpoint_appended
        from controlplane.notify.checkpoints import post_checkpoint

        checkpoint_appended.connect(post_checkpoint, dispatch_uid="notify.post_checkpoint")
