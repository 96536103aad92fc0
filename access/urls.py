from __future__ import annotations

from django.urls import path

from access import views

urlpatterns = [
    path("account/tokens/", views.token_list, name="token-list"),
    path("account/tokens/<str:key>/revoke/", views.token_revoke_view, name="token-revoke"),
]
