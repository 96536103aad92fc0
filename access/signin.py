"""Sign-in limits that slow a guesser and never lock the user out (django-axes' handler, made to wait).

Failed sign-ins are counted per user name and address (axes' records, the address from
access/client.py). Two waits, neither a lock:

- **One address**: after ``LLMGW_SIGNIN_FAILURES`` failures of a user from one address, each further
  try from there waits a second, then twice as long after each failure, up to
  ``LLMGW_SIGNIN_LONGEST_WAIT_MINUTES``. A stranger's failures from another address do not touch the
  user's own count: the user signs in from elsewhere at once.
- **Many addresses**: after ``LLMGW_SIGNIN_ACCOUNT_FAILURES`` failures of a user from all addresses
  together, a try from an address the user has not signed in from in the last KNOWN_DAYS waits the
  same way (a guesser spread over many addresses gets a few dozen tries an hour, not one per address);
  a try from an address the user did sign in from does not.

A try during a wait is refused (429, Retry-After, access/lockout.py says until when) without its
password being checked, and is not counted, so the wait does not grow while the user waits. A success
clears that address's count. Counts are forgotten after an hour of quiet (forget_after; axes' AXES_COOLOFF_TIME).
``manage.py axes_reset_username USER`` ends a user's waits at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username
from axes.models import AccessAttempt, AccessLog
from django.conf import settings
from django.db.models import Max, Sum
from django.utils import timezone

FIRST_WAIT = timedelta(seconds=1)
KNOWN_DAYS = 30


@dataclass(frozen=True)
class Limits:
    free: int  # failures of a user from one address before its tries wait
    account_free: int  # failures of a user from all addresses before new addresses' tries wait
    longest: timedelta

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(
            free=settings.LLMGW_SIGNIN_FAILURES,
            account_free=settings.LLMGW_SIGNIN_ACCOUNT_FAILURES,
            longest=timedelta(minutes=settings.LLMGW_SIGNIN_LONGEST_WAIT_MINUTES),
        )


def wait_after(failures: int, free: int, longest: timedelta) -> timedelta:
    """How long the next try waits after ``failures``: nothing within ``free``, then a second that
    doubles with each further failure, never beyond ``longest``."""
    if failures < free:
        return timedelta(0)
    doublings = failures - free
    if doublings > 40:  # far past any longest wait; 2**doublings seconds would not fit a timedelta
        return longest
    return min(FIRST_WAIT * 2**doublings, longest)


def forget_after(longest: timedelta) -> timedelta:
    """How long a count is kept after its last failure: an hour, or twice the longest wait if longer,
    so a count is never forgotten while its wait still runs."""
    return max(timedelta(hours=1), 2 * longest)


def forget_time(request: Any = None) -> timedelta:
    """axes' AXES_COOLOFF_TIME: the records of failures older than this are dropped."""
    return forget_after(Limits.from_settings().longest)


@dataclass(frozen=True)
class Wait:
    until: datetime
    why: Literal["address", "account"]


def _failures(username: str | None, since: datetime, **where: Any) -> tuple[int, datetime | None]:
    """The failures counted for ``username`` (from the address in ``where``, or from all) and the last."""
    found = AccessAttempt.objects.filter(username=username, attempt_time__gte=since, **where).aggregate(
        count=Sum("failures_since_start"), last=Max("attempt_time")
    )
    return found["count"] or 0, found["last"]


def _known(username: str | None, address: str | None, now: datetime) -> bool:
    """Whether ``username`` signed in from ``address`` in the last KNOWN_DAYS (axes' access log)."""
    since = now - timedelta(days=KNOWN_DAYS)
    return AccessLog.objects.filter(username=username, ip_address=address, attempt_time__gte=since).exists()


def wait_for(username: str | None, address: str | None, now: datetime | None = None) -> Wait | None:
    """The wait a sign-in as ``username`` from ``address`` is under at ``now``, if any."""
    now = now or timezone.now()
    limits = Limits.from_settings()
    since = now - forget_after(limits.longest)
    count, last = _failures(username, since, ip_address=address)
    if last is not None and now < (until := last + wait_after(count, limits.free, limits.longest)):
        return Wait(until, "address")
    count, last = _failures(username, since)
    if last is None or count < limits.account_free:
        return None
    until = last + wait_after(count, limits.account_free, limits.longest)
    if now < until and not _known(username, address, now):
        return Wait(until, "account")
    return None


class SigninHandler(AxesDatabaseHandler):
    """axes' database handler, its lock-out made a wait: a try is refused only while a wait runs."""

    def is_locked(self, request: Any, credentials: dict[str, Any] | None = None) -> bool:
        wait = wait_for(get_client_username(request, credentials), request.axes_ip_address)
        request.llmgw_signin_wait = wait
        return wait is not None

    def user_login_failed(
        self, sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any
    ) -> None:
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is None or getattr(request, "axes_locked_out", False):
            return  # refused during a wait: not counted (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT)
        # Counted: if the next try must now wait, say so at once, with until when.
        if self.is_locked(request, credentials):
            request.axes_locked_out = True
            request.axes_credentials = credentials
