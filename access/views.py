"""A user's own API tokens (list, create with the secret shown once, revoke) and password."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import authenticate, update_session_auth_hash
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from access.models import Token
from access.services import password_change, token_create, token_revoke
from base.errors import DomainError
from base.rules import SIGNED_IN, requires


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What will use it, e.g. ci-deploy.")
    days = forms.IntegerField(
        min_value=1, initial=30, help_text="Days until it expires; it can be revoked before."
    )

    def clean_days(self) -> int:
        days: int = self.cleaned_data["days"]
        if days > settings.LLMGW_TOKEN_MAX_DAYS:
            raise forms.ValidationError(
                f"At most {settings.LLMGW_TOKEN_MAX_DAYS} days (LLMGW_TOKEN_MAX_DAYS sets the longest)."
            )
        return days


@requires(SIGNED_IN)
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    secret = ""
    if request.method == "POST" and form.is_valid():
        try:
            token, secret = token_create(
                user=request.user, name=form.cleaned_data["name"], days=form.cleaned_data["days"]
            )
        except DomainError as err:
            form.add_error(None, err.message)
        else:
            form = TokenForm()
            messages.success(
                request, f"Token {token.name!r} made. Copy its secret now: it is not shown again."
            )
    tokens = Token.objects.filter(user=request.user).order_by("name")
    return render(
        request,
        "access/tokens.html",
        {"section": "tokens", "form": form, "tokens": tokens, "secret": secret},
        status=400 if form.errors else 200,
    )


@requires(SIGNED_IN)
@require_POST
def token_revoke_view(request: HttpRequest, key: str) -> HttpResponse:
    # Only the user's own: another user's token is "not found", not "not allowed".
    token = get_object_or_404(Token, user=request.user, token_key=key)
    token_revoke(token=token)
    messages.success(request, f"Token {token.name!r} revoked: it no longer works.")
    return redirect("token-list")


class PasswordForm(forms.Form):
    current = forms.CharField(
        label="Current password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
    )
    new = forms.CharField(
        label="New password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="12 characters or more, not a common password; any characters.",
    )
    again = forms.CharField(
        label="New password again",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("new") and data.get("again") and data["new"] != data["again"]:
            self.add_error("again", "The two new passwords differ: type the same one twice.")
        return data


@requires(SIGNED_IN)
@require_http_methods(["GET", "POST"])
def password_view(request: HttpRequest) -> HttpResponse:
    form = PasswordForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = request.user
        # Checked as a sign-in is (django-axes): a wrong one counts, and past the limit the next waits
        # (the middleware answers 429), so a borrowed session cannot guess the password here.
        if authenticate(request, username=user.get_username(), password=form.cleaned_data["current"]) is None:
            form.add_error("current", "The current password is not right: give it as you sign in with it.")
        else:
            try:
                password_change(user=user, new=form.cleaned_data["new"])
            except DomainError as err:
                form.add_error("new", err.message)
            else:
                # This session stays; every other one of the user's ends with the old password's hash.
                update_session_auth_hash(request, user)  # type: ignore[arg-type]  # signed in (requires)
                messages.success(request, "Password changed. Your other sessions are signed out.")
                return redirect("password-change")
    return render(
        request,
        "access/password.html",
        {"section": "password", "form": form},
        status=400 if form.errors else 200,
    )
