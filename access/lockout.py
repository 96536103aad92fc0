"""What a locked-out sign-in reads (django-axes' lockout callable): when it may try again."""

from __future__ import annotations

from typing import Any

from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone


def locked_out(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    username = get_client_username(request, credentials) or ""
    cool_off = get_cool_off(request)
    last = (
        AccessAttempt.objects.filter(username=username, ip_address=getattr(request, "axes_ip_address", None))
        .order_by("-attempt_time")
        .values_list("attempt_time", flat=True)
        .first()
    )
    until = (last or timezone.now()) + cool_off if cool_off else None
    if until is not None:
        minutes = max(1, round((until - timezone.now()).total_seconds() / 60))
        when = f"at {until:%H:%M} UTC (in about {minutes} minute{'s' if minutes != 1 else ''})"
    else:
        when = "when an admin unlocks it"
    sentence = (
        f"Too many failed sign-ins for {username or 'this account'} from your address: signing in is refused "
        f"until it is unlocked, {when}, even with the right password. An admin can unlock it sooner "
        f"(manage.py axes_reset_username {username or 'USER'})."
    )
    # One page for both sign-in pages (the operators' and the admin's).
    return render(request, "registration/locked_out.html", {"sentence": sentence}, status=429)
