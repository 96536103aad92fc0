from __future__ import annotations

from django.urls import path

from audit.api import views

urlpatterns = [
    path("audit/", views.AuditEntryList.as_view(), name="api-audit-list"),
    path("audit/export.<str:kind>", views.AuditExport.as_view(), name="api-audit-export"),
]
