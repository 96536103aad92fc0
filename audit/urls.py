from __future__ import annotations

from django.urls import path

from audit import views

app_name = "audit"

urlpatterns = [
    path("", views.entry_list, name="entry_list"),
    path("<int:pk>/", views.entry_detail, name="entry_detail"),
    path("outside/", views.outside_list, name="outside_list"),
    path("export.<str:kind>", views.entry_export, name="entry_export"),
]
