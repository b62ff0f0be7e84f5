"""The approval inbox: the refreshes awaiting *my* approval, as a page and a live badge.

"Mine" follows the approve rule of `intents.lifecycle.approve_policy_refresh`: the person may
approve (`Perm.APPROVE_REFRESH`) and did not request the refresh (four eyes). A refresh
requested by a trainer's webhook or the command line has no requesting user, so every approver
sees it.

The badge in the top bar of every page is filled by `static/js/inbox.js` from `ws/inbox/`
(`InboxConsumer`): a plain socket carrying `{"count": n}`, not the htmx ws extension, so the
top bar's "Live" indicator (which speaks for a page's own stream) stays out of it. The stream
listens to the `refreshes` group every state change is published to, so a new approval shows
within one publish of the `start` that asked for it; the socket's resync on (re)connect gives
the current count, since the channel layer may drop messages.
"""

from __future__ import annotations

import json

from channels.db import database_sync_to_async
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.realtime import LiveStream
from controlplane.refresh.live import REFRESHES_GROUP
from controlplane.refresh.models import PolicyRefresh, RefreshState

#: The inbox page lists at most this many (oldest first: they have waited longest).
INBOX_LIMIT = 200


def awaiting_approval_by(user) -> QuerySet[PolicyRefresh]:
    """Refreshes `user` may approve now: awaiting approval, not requested by `user`."""
    if not (user.is_authenticated and user.has_perm(Perm.APPROVE_REFRESH)):
        return PolicyRefresh.objects.none()
    # `exclude` keeps refreshes with no requesting user (NULL is not this user).
    return PolicyRefresh.objects.filter(state=RefreshState.AWAITING_APPROVAL).exclude(
        requested_by=user.pk
    )


def approvable_ids(user, refreshes: list[PolicyRefresh]) -> set[int]:
    """Which of `refreshes` (already loaded) await `user`'s approval: one permission check,
    no query, for the "awaiting your approval" cue on list rows."""
    if not (user.is_authenticated and user.has_perm(Perm.APPROVE_REFRESH)):
        return set()
    return {
        r.pk
        for r in refreshes
        if r.state == RefreshState.AWAITING_APPROVAL and r.requested_by_id != user.pk
    }


@require_GET
@requires(Perm.APPROVE_REFRESH)
def inbox(request: HttpRequest) -> HttpResponse:
    waiting = awaiting_approval_by(request.user).select_related("source").order_by("id")
    rows = list(waiting[:INBOX_LIMIT])
    context = {"rows": rows, "total": waiting.count() if len(rows) == INBOX_LIMIT else len(rows)}
    return render(request, "refresh/inbox.html", context)


class InboxConsumer(LiveStream):
    """`ws/inbox/`: the number of refreshes awaiting the connected approver's approval, as
    `{"count": n}`, sent on connect and whenever a refresh state change moves it."""

    groups_to_join = (REFRESHES_GROUP,)

    async def authorize(self) -> bool:
        return await database_sync_to_async(self._may_approve)()

    def _may_approve(self) -> bool:
        user = self.scope.get("user")
        return bool(user and user.is_authenticated and user.has_perm(Perm.APPROVE_REFRESH))

    async def prepare(self) -> bool:
        self.sent: int | None = None
        return True

    def resync(self) -> list[str]:
        self.sent = None
        return self._count_frame()

    def render(self, event: str, payload: dict) -> list[str]:
        return self._count_frame()

    def _count_frame(self) -> list[str]:
        count = awaiting_approval_by(self.scope["user"]).count()
        if count == self.sent:
            return []  # most state changes (steps of running refreshes) do not move it
        self.sent = count
        return [json.dumps({"count": count})]
