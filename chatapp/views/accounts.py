from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import UserCreationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from ..ratelimits import SIGNUPS_PER_ADDRESS, by_address, limit_posts


@limit_posts((SIGNUPS_PER_ADDRESS, by_address))
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("chat:index")
    form = UserCreationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        login(request, form.save(), backend="django.contrib.auth.backends.ModelBackend")
        return redirect("chat:index")
    return render(request, "registration/signup.html", {"form": form}, status=400 if form.errors else 200)


class EmailForm(forms.ModelForm):
    """The address a password reset link is sent to (signing up asks for none)."""

    class Meta:
        model = get_user_model()
        fields = ["email"]
        help_texts = {"email": "Where a link to reset your password is sent if you forget it."}


@login_required
def account_settings(request: HttpRequest) -> HttpResponse:
    """The account page: who you are, the e-mail address for password resets, a link to change the password."""
    form = EmailForm(request.POST or None, instance=request.user)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Your e-mail address was saved.")
        return redirect("account_settings")
    return render(request, "registration/account_settings.html", {"form": form}, status=400 if form.errors else 200)
