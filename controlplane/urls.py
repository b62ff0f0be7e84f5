from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path
from django.views.decorators.http import require_safe


@login_not_required
@require_safe
def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """Pages link their icon (base.html); this answers whatever asks for the old name."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon),
    path("", include("controlplane.fleet.urls")),
    path("refreshes/", include("controlplane.refresh.urls")),
    path("", include("controlplane.analysis.urls")),
    path("", include("controlplane.intake.urls")),
    path("accounts/", include("controlplane.accounts.urls")),
    path("history/", include("controlplane.audit.urls")),
    path("versions/", include("controlplane.intake.provenance.urls")),
    path("search/", include("controlplane.intake.search.urls")),
]

handler403 = "controlplane.errors.permission_denied"
handler404 = "controlplane.errors.page_not_found"
handler500 = "controlplane.errors.server_error"
