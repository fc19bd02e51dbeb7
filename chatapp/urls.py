from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path, register_converter
from django.views.generic import RedirectView

from . import views
from .converters import SessionIdConverter
from .ratelimits import LOGINS_PER_ADDRESS, PASSWORD_RESETS_PER_ADDRESS, by_address, limit_posts, limit_sign_ins

register_converter(SessionIdConverter, "sid")

chat_patterns = [
    path("", views.index, name="index"),
    path("new/", views.new_session, name="new"),
    path("trash/", views.trash, name="trash"),
    path("trash/empty/", views.trash_empty_hx, name="trash_empty_hx"),
    path("export/", views.export_all, name="export_all"),
    path("import/", views.import_chats, name="import"),
    path("transfers/<slug:transfer_id>/", views.transfer, name="transfer"),
    path("transfers/<slug:transfer_id>/download/", views.transfer_download, name="transfer_download"),
    path("sessions/", views.session_list_hx, name="session_list_hx"),
    path("s/<sid:session_id>/", views.session_page, name="session"),
    path("s/<sid:session_id>/runs/", views.transcript_hx, name="transcript_hx"),
    path("s/<sid:session_id>/version/", views.session_version, name="session_version"),
    path("s/<sid:session_id>/rename/", views.session_rename_hx, name="session_rename_hx"),
    path("s/<sid:session_id>/pin/", views.session_pin_hx, name="session_pin_hx"),
    path("s/<sid:session_id>/delete/", views.session_delete_hx, name="session_delete_hx"),
    path("s/<sid:session_id>/restore/", views.session_restore_hx, name="session_restore_hx"),
    path("s/<sid:session_id>/destroy/", views.session_destroy_hx, name="session_destroy_hx"),
    path("s/<sid:session_id>/title/", views.session_retitle_hx, name="session_retitle_hx"),
    path("s/<sid:session_id>/state/", views.state_panel_hx, name="state_panel_hx"),
    path("s/<sid:session_id>/export.md", views.session_export_markdown, name="session_export_markdown"),
    path("s/<sid:session_id>/export.json", views.session_export_json, name="session_export_json"),
    path("s/<sid:session_id>/state/edit/", views.state_edit_hx, name="state_edit_hx"),
    path("s/<sid:session_id>/state/v<int:version>/", views.state_version_hx, name="state_version_hx"),
    path("search/", views.search_hx, name="search_hx"),
    path("fork/", views.fork, name="fork"),
    path("memories/", views.memories_page, name="memories"),
    path("memories/add/", views.memory_add, name="memory_add"),
    path("memories/forget/", views.memories_forget, name="memories_forget"),
    path("memories/setting/", views.memories_setting, name="memories_setting"),
    path("memories/<str:memory_id>/edit/", views.memory_edit, name="memory_edit"),
    path("memories/<str:memory_id>/delete/", views.memory_delete, name="memory_delete"),
    path("runs/<str:run_id>/memories/undo/", views.memory_undo, name="memory_undo"),
]

class FaviconRedirect(RedirectView):
    """The icon's URL is asked for at request time: with hashed static names (production) it needs the
    manifest collectstatic writes, which does not exist yet when the URL conf is first loaded."""

    def get_redirect_url(self, *args, **kwargs):
        return static("chatapp/favicon.svg")


urlpatterns = [
    # Pages without the icon link (the admin's) make the browser ask for /favicon.ico.
    path("favicon.ico", FaviconRedirect.as_view(permanent=True)),
    # The admin's own login form counts against the same sign-in limits (its failures are counted already).
    path("admin/login/", limit_sign_ins(admin.site.login)),
    path("admin/", admin.site.urls),
    path("accounts/login/", limit_sign_ins(auth_views.LoginView.as_view(redirect_authenticated_user=True)),
         name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/settings/", views.account_settings, name="account_settings"),
    # Django's own views; a password typed to change it counts as a sign-in attempt of the address.
    path("accounts/password/change/", limit_posts((LOGINS_PER_ADDRESS, by_address))(
        auth_views.PasswordChangeView.as_view()), name="password_change"),
    path("accounts/password/change/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("accounts/password/reset/", limit_posts((PASSWORD_RESETS_PER_ADDRESS, by_address))(
        auth_views.PasswordResetView.as_view()), name="password_reset"),
    path("accounts/password/reset/sent/", auth_views.PasswordResetDoneView.as_view(), name="password_reset_done"),
    path("accounts/reset/<uidb64>/<token>/", auth_views.PasswordResetConfirmView.as_view(),
         name="password_reset_confirm"),
    path("accounts/reset/done/", auth_views.PasswordResetCompleteView.as_view(), name="password_reset_complete"),
    path("", include((chat_patterns, "chat"))),
]
