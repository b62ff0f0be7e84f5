from django.urls import path

from controlplane.refresh import analysis_views, inbox, list_views, views
from controlplane.refresh.drills import views as drill_views

app_name = "refresh"

urlpatterns = [
    path("", list_views.refresh_list, name="list"),
    path("inbox/", inbox.inbox, name="inbox"),
    path("new/", views.plan, name="plan"),
    path("gates/", views.gate_list, name="gates"),
    path("gates/<int:pk>/actions/", views.gate_actions, name="gate_actions"),
    path("gates/<int:pk>/force-reopen/", views.force_reopen, name="force_reopen"),
    path("quarantines/<int:pk>/retry/", views.quarantine_retry, name="quarantine_retry"),
    path("quarantines/<int:pk>/release/", views.quarantine_release, name="quarantine_release"),
    path("quarantines/<int:pk>/drop/", views.quarantine_drop, name="quarantine_drop"),
    path("drills/<int:pk>/", drill_views.drill_detail, name="drill"),
    path("drills/sources/<int:pk>/start/", drill_views.drill_start, name="drill_start"),
    path("<int:pk>/", views.detail, name="detail"),
    path("<int:pk>/analysis/", analysis_views.analysis_report, name="analysis"),
    path("<int:pk>/actions/", views.refresh_actions, name="actions"),
    path("<int:pk>/worker-timeline/", views.worker_timeline, name="worker_timeline"),
    path("<int:pk>/start/", views.start, name="start"),
    path("<int:pk>/discard/", views.discard, name="discard"),
    path("<int:pk>/approve/", views.approve, name="approve"),
    path("<int:pk>/reject/", views.reject, name="reject"),
    path("<int:pk>/abort/", views.abort, name="abort"),
    path("<int:pk>/retry/", views.retry, name="retry"),
    path("<int:pk>/rollback/", views.rollback, name="rollback"),
    path("<int:pk>/end/", views.end, name="end"),
    path("<int:pk>/resolve-membership/", views.resolve_membership, name="resolve_membership"),
    path("<int:pk>/reopen-verified/", views.reopen_verified, name="reopen_verified"),
    path("<int:pk>/force-reopen/", views.force_reopen_namespace, name="force_reopen_namespace"),
    path("<int:pk>/pause/", views.pause_at_next_wave, name="pause"),
    path("sources/<int:pk>/rollback/", views.rollback_plan, name="rollback_plan"),
    path("sources/<int:pk>/strategy/", views.source_strategy, name="source_strategy"),
    path("<int:pk>/continue/", views.continue_refresh, name="continue"),
    path("<int:pk>/approve-canary/", views.approve_canary, name="approve_canary"),
    path("<int:pk>/reject-canary/", views.reject_canary, name="reject_canary"),
]
