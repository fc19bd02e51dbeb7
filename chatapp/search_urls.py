"""Search routes, included by chatapp/urls.py at `search/` in the `chat` namespace."""

from django.urls import path

from .search_views import search_hx

urlpatterns = [
    path("", search_hx, name="search_hx"),
]
