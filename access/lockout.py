"""What a sign-in made to wait reads (django-axes' lockout callable): why, and until when.

A 429 with ``Retry-After`` (seconds), on both sign-in pages (the operators' and the admin's); the
waits themselves are access/signin.py's.
"""

from __future__ import annotations

import math
from typing import Any

from axes.helpers import get_client_username
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from access.signin import KNOWN_DAYS, Limits, Wait, wait_for


def _in_about(seconds: float) -> str:
    if seconds < 90:
        whole = max(1, math.ceil(seconds))
        return f"{whole} second{'s' if whole != 1 else ''}"
    minutes = round(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def sentence_for(username: str, wait: Wait, seconds: float) -> str:
    who = username or "this account"
    when = f"{wait.until:%H:%M:%S} UTC (in {_in_about(seconds)})"
    longest = Limits.from_settings().longest
    if wait.why == "address":
        return (
            f"Too many failed sign-ins as {who} from your address: try again after {when}. Each further "
            f"failure doubles the wait, up to {_in_about(longest.total_seconds())}; a success ends it. Failures "
            "from other addresses do not add to this wait."
        )
    return (
        f"Too many failed sign-ins as {who} from many addresses: from an address {who} has not signed in "
        f"from in the last {KNOWN_DAYS} days, try again after {when}. From one {who} has, signing in is not "
        "held up."
    )


def locked_out(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    username = get_client_username(request, credentials) or ""
    now = timezone.now()
    wait = getattr(request, "llmgw_signin_wait", None) or wait_for(
        username, getattr(request, "axes_ip_address", None), now
    )
    if wait is None:  # the wait ended in between: a plain refusal, to be tried again at once
        wait = Wait(now, "address")
    seconds = max(0.0, (wait.until - now).total_seconds())
    sentence = sentence_for(username, wait, seconds)
    response = render(request, "registration/locked_out.html", {"sentence": sentence}, status=429)
    response["Retry-After"] = str(max(1, math.ceil(seconds)))
    return response
