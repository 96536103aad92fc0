from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from access import views
from base.rules import PUBLIC, requires

urlpatterns = [
    path(
        "accounts/login/",
        requires(PUBLIC)(auth_views.LoginView.as_view(redirect_authenticated_user=True)),
        name="login",
    ),
    path("accounts/logout/", requires(PUBLIC)(auth_views.LogoutView.as_view()), name="logout"),
    path("account/tokens/", views.token_list, name="token-list"),
    path("account/password/", views.password_view, name="password-change"),
    path("account/tokens/<str:key>/revoke/", views.token_revoke_view, name="token-revoke"),
]
