from django.urls import path

from controlplane.analysis import views

app_name = "analysis"

# By source name, like the API (/api/v1/sources/<name>/analysis-templates/): fleet's own pages
# use the numeric pk, and a source name is a slug, so the two never match the same path.
urlpatterns = [
    path("sources/<slug:source>/analysis/", views.template_list, name="templates"),
    path("sources/<slug:source>/analysis/<slug:name>/", views.template_detail, name="template"),
]
