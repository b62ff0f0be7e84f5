"""The refresh list: one table of every refresh, newest first, filtered by GET parameters
(`state`, `source`, `who`, `since`), paged, and kept live by `ws/refresh-list/` with the same
query string.

One table rather than a table per state group: its columns line up, a filter or a page is a
URL, and a refresh changing state moves within it instead of jumping between tables. A plan
that was discarded (ended without ever starting) reads "discarded", as the detail page says.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django import forms
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET

from controlplane.accounts.access import requires
from controlplane.accounts.roles import Perm
from controlplane.fleet.models import Source
from controlplane.realtime import LiveStream
from controlplane.refresh.inbox import approvable_ids
from controlplane.refresh.live import REFRESHES_GROUP
from controlplane.refresh.models import TERMINAL_STATES, PolicyRefresh, RefreshState

#: Rows per page: bounded, so neither the page nor a live redraw grows with the history.
PAGE_SIZE = 50
#: `state=discarded`: a plan ended without ever starting (stored as aborted, never started).
DISCARDED = "discarded"
NEVER_STARTED = Q(state=RefreshState.ABORTED, started_at__isnull=True)


class RefreshFilterForm(forms.Form):
    """The list's filters. Every field is optional; an invalid one shows its error and an
    empty table (never an unfiltered one that looks filtered)."""

    state = forms.ChoiceField(
        required=False,
        choices=[("", "any state"), *RefreshState.choices, (DISCARDED, "Discarded")],
    )
    source = forms.ModelChoiceField(
        required=False,
        queryset=Source.objects.order_by("name"),
        to_field_name="name",
        empty_label="any source",
    )
    who = forms.CharField(
        required=False,
        max_length=150,
        label="Requested by",
        help_text="user, token or webhook label (part of it)",
    )
    since = forms.DateField(
        required=False,
        label="Created since",
        widget=forms.DateInput(attrs={"type": "date"}),
        help_text="UTC date",
    )

    def filter(self, refreshes: QuerySet[PolicyRefresh]) -> QuerySet[PolicyRefresh]:
        data = self.cleaned_data
        state = data.get("state")
        if state == DISCARDED:
            refreshes = refreshes.filter(NEVER_STARTED)
        elif state == RefreshState.ABORTED:
            refreshes = refreshes.filter(state=state).exclude(NEVER_STARTED)
        elif state:
            refreshes = refreshes.filter(state=state)
        if data.get("source") is not None:
            refreshes = refreshes.filter(source=data["source"])
        if data.get("who"):
            refreshes = refreshes.filter(requested_by_label__icontains=data["who"].strip())
        if data.get("since") is not None:
            start = dt.datetime.combine(data["since"], dt.time.min, tzinfo=dt.UTC)
            refreshes = refreshes.filter(created_at__gte=start)
        return refreshes


@dataclass(frozen=True)
class ListRow:
    """One refresh as the list shows it."""

    refresh: PolicyRefresh
    #: The state badge's class and text ("discarded" for a plan never started).
    badge: str
    label: str
    #: How it ended (terminal states only): a short word and what it names.
    outcome: str
    outcome_detail: str
    #: Started → finished, or → now while it runs; "" for a refresh that never started.
    duration: dt.timedelta | None
    running: bool
    awaits_me: bool


def _outcome(r: PolicyRefresh) -> tuple[str, str]:
    if r.state not in TERMINAL_STATES:
        return "", ""
    if r.state == RefreshState.SUCCEEDED:
        return "verified", ""
    if r.state == RefreshState.ABORTED and r.started_at is None:
        return "never started", ""
    if r.state == RefreshState.FAILED:
        return "failed", f"at {r.failed_step}" if r.failed_step else ""
    if r.state == RefreshState.ROLLED_BACK:
        return "rolled back", ""
    return r.get_state_display().lower(), r.end_reason


def list_rows(refreshes: list[PolicyRefresh], user, now: dt.datetime) -> list[ListRow]:
    mine = approvable_ids(user, refreshes)
    rows = []
    for r in refreshes:
        discarded = r.state == RefreshState.ABORTED and r.started_at is None
        outcome, detail = _outcome(r)
        end = r.finished_at or (None if r.state in TERMINAL_STATES else now)
        rows.append(
            ListRow(
                refresh=r,
                badge=DISCARDED if discarded else r.state,
                label=DISCARDED if discarded else r.get_state_display().lower(),
                outcome=outcome,
                outcome_detail=detail,
                duration=(end - r.started_at) if r.started_at and end else None,
                running=r.finished_at is None and r.started_at is not None,
                awaits_me=r.pk in mine,
            )
        )
    return rows


@dataclass(frozen=True)
class RefreshPage:
    form: RefreshFilterForm
    page: Page
    rows: list[ListRow]
    #: The filters as a query string without `page` (pager links, the live stream's URL).
    query: str


def refresh_page(query: QueryDict, user) -> RefreshPage:
    form = RefreshFilterForm(query or None)
    refreshes = PolicyRefresh.objects.select_related("source").order_by("-id")
    if form.is_bound:
        refreshes = form.filter(refreshes) if form.is_valid() else refreshes.none()
    page = Paginator(refreshes, PAGE_SIZE).get_page(query.get("page"))
    rows = list_rows(list(page.object_list), user, timezone.now())
    kept = query.copy()
    kept.pop("page", None)
    return RefreshPage(form, page, rows, kept.urlencode())


@require_GET
@requires(Perm.VIEW)
def refresh_list(request: HttpRequest) -> HttpResponse:
    listing = refresh_page(request.GET, request.user)
    context = {"listing": listing, "page_query": request.GET.urlencode()}
    return render(request, "refresh/list.html", context)


class RefreshListConsumer(LiveStream):
    """`ws/refresh-list/?<the page's query>`: the rows of the page the client shows, redrawn
    whenever a refresh changes state (rows are per person: the "awaiting your approval" cue).
    A page is at most `PAGE_SIZE` rows, so a redraw is one bounded query."""

    groups_to_join = (REFRESHES_GROUP,)

    async def prepare(self) -> bool:
        self.query = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        self.sent = ""
        return True

    def resync(self) -> list[str]:
        listing = refresh_page(self.query, self.scope["user"])
        # Stripped: a table fragment must start with its own tag (see the fleet consumers).
        self.sent = render_to_string(
            "refresh/_table.html#rows", {"listing": listing, "oob": True}
        ).strip()
        return [self.sent]

    def render(self, event: str, payload: dict) -> list[str]:
        before = self.sent
        frames = self.resync()
        return [] if frames == [before] else frames
