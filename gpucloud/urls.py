from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.views import LogoutView
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from frontend.account_views import ApiSignInView
from gpucloud.metrics import metrics_view

# The browsable API's sign-in (DRF's namespace and template): the console's sign-in, so it
# asks for the second factor and django-axes counts it like every other.
api_auth = ([
    path("login/", ApiSignInView.as_view(), name="login"),
    path("logout/", LogoutView.as_view(), name="logout"),
], "rest_framework")

urlpatterns = [
    path("admin/fleet/", include("frontend.fleet.urls")),  # before admin/, whose catch-all 404s it
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/", include("gpucloud.api.urls")),
    path("agent/v1/volume-moves/", include("volumes.agent_urls")),
    path("agent/v1/", include("agents.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/auth/", include(api_auth)),
    path("", include("frontend.urls")),
]

handler400 = "gpucloud.api.errors.handler400"
handler403 = "gpucloud.api.errors.handler403"
handler404 = "gpucloud.api.errors.handler404"
handler500 = "gpucloud.api.errors.handler500"
