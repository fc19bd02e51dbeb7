"""The authorization matrix: every URL of the URL conf and every socket route, read from the conf (a new
route is covered without editing this file), against the owner, another user, an anonymous visitor and
staff (a superuser who does not own the chat: the admin is where staff look, never the chat pages).

A chat URL of Alice's session (or memory, or run) answers her, and is a 404 to anyone else signed in (a redirect to the
login for anonymous visitors), for GET and for POST; nothing of hers is changed and her words appear
in no one else's response. An admin URL is staff's only. A socket route accepts Alice alone (4403
for other users and staff, 4401 for anonymous visitors)."""

from __future__ import annotations

import re

from asgiref.sync import async_to_sync
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.test import Client, TransactionTestCase, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls.resolvers import RegexPattern

from chatapp import transfers
from chatapp.models import Transfer
from chatapp.routing import websocket_urlpatterns
from sessions_core.models import ChatSession, Message, Run, StateChange, UserMemoryChange, UserMemoryRecord
from sessions_core.user_memories import store as memory_store
from tests.support.factories import make_run, make_session, make_user
from chatapp.asgi import application
from channels.testing import WebsocketCommunicator
from tests.support.live_support import HOST, ORIGIN, LiveTestMixin

SECRET = "zebra-armchair-7731"  # Alice's words: in her title, her message, her state
ROLES = ("owner", "other", "anonymous", "staff")
# The pages anyone may open (logout is POST-only; a forgotten password is reset without signing in).
PUBLIC = {"login", "signup", "logout", "password_reset", "password_reset_done", "password_reset_confirm",
          "password_reset_complete"}
OWNED = {"session_id", "memory_id", "run_id", "transfer_id"}  # a URL naming one of these names something of Alice's


def url_patterns(resolver=None, prefix: str = "", namespace: str = ""):
    """(view name with its namespace, the pattern's keyword names, the regex of a RegexPattern) of every URL."""
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            space = f"{namespace}:{entry.namespace}" if entry.namespace and namespace else entry.namespace or namespace
            yield from url_patterns(entry, prefix + str(entry.pattern), space)
        elif isinstance(entry, URLPattern) and entry.name:
            name = f"{namespace}:{entry.name}" if namespace else entry.name
            regex = entry.pattern._regex if isinstance(entry.pattern, RegexPattern) else ""
            yield name, list(entry.pattern.regex.groupindex), prefix + str(entry.pattern), regex


class TestMatrix(LiveTestMixin, TransactionTestCase):
    def setUp(self):
        User = get_user_model()
        self.alice = make_user("alice")
        self.bob = make_user("bob")
        self.root = User.objects.create_superuser("root", "root@example.com", "pw-root-123")
        self.session = make_session(self.alice, component_id="shopping", name=f"Plans {SECRET}", name_source="user")
        self.run = make_run(self.session, f"remember {SECRET}", "Noted.")
        self.memory = memory_store.add_memory(self.alice, f"The user said {SECRET}", ["secret"], "default",
                                              source=memory_store.Source.RUN, run_pk=self.run.pk)
        self.session.apply_state_change({"note": SECRET}, "manual")
        self.trashed = make_session(self.alice, component_id="general", name=f"Old {SECRET}")
        self.trashed.deleted_at = self.trashed.created_at
        self.trashed.save()
        self.transfer = Transfer.objects.create(owner=self.alice, kind="export", status="done", done=1, total=1,
                                                filename="chats-alice.json")
        transfers.export_path(self.transfer).write_text(f'{{"name": "Plans {SECRET}"}}')

    def client_for(self, role: str) -> Client:
        client = Client()
        user = {"owner": self.alice, "other": self.bob, "staff": self.root}.get(role)
        if user is not None:
            client.force_login(user)
        return client

    def kwargs_for(self, name: str, keys: list[str], regex: str) -> dict:
        values = {}
        for key in keys:
            if key == "session_id":
                # The trash's own actions (restore, destroy) need a session in the trash.
                session = self.trashed if name.endswith(("restore_hx", "destroy_hx")) else self.session
                values[key] = session.session_id
            elif key == "version":
                values[key] = 1
            elif key == "memory_id":
                values[key] = self.memory.memory_id
            elif key == "run_id":
                values[key] = self.run.run_id
            elif key == "transfer_id":  # an export of hers, done: its page and its file
                values[key] = self.transfer.transfer_id
            elif key in ("uidb64", "token"):  # a password reset link's parts: this one is no valid link
                values[key] = "MQ" if key == "uidb64" else "not-a-token"
            elif key in ("pk", "object_id", "id"):
                model = self.admin_model(name)
                values[key] = str(self.alice.pk if model is get_user_model() else self.session.pk)
            elif key == "content_type_id":
                values[key] = ContentType.objects.get_for_model(ChatSession).pk
            elif key == "app_label":
                values[key] = re.search(r"\(\?P<app_label>([\w]+)", regex).group(1)
            elif key == "url":
                values[key] = "nowhere/"
            else:
                raise AssertionError(f"{name}: no value for <{key}>: teach this test what it takes")
        return values

    @staticmethod
    def admin_model(name: str):
        match = re.match(r"admin:(\w+?)_(\w+?)_", name)
        for model in apps.get_models():
            if match and (model._meta.app_label, model._meta.model_name) == match.groups():
                return model
        return None

    def snapshot(self) -> tuple:
        session = ChatSession.objects.get(pk=self.session.pk)
        trashed = ChatSession.objects.get(pk=self.trashed.pk)
        return (session.name, session.session_state, session.state_version, session.pinned_at, session.deleted_at,
                trashed.deleted_at, Run.objects.count(), Message.objects.count(), StateChange.objects.count(),
                ChatSession.objects.filter(owner=self.alice).count(),
                list(UserMemoryRecord.objects.values_list("memory", flat=True)), UserMemoryChange.objects.count())

    @staticmethod
    def body(response) -> str:
        if response.streaming:
            async def collect():
                return b"".join([part async for part in response.streaming_content])
            return async_to_sync(collect)().decode(errors="replace")
        return response.content.decode(errors="replace")

    def test_every_url_against_every_role(self):
        patterns = list(url_patterns())
        chat = [p for p in patterns if p[0].startswith("chat:")]
        admin = [p for p in patterns if p[0].startswith("admin:")]
        assert len(chat) >= 20 and len(admin) >= 20 and {p[0] for p in patterns} >= {"login", "signup", "logout"}
        before = self.snapshot()
        checked, self.refused = 0, set()
        for name, keys, route, regex in patterns:
            url = reverse(name, kwargs=self.kwargs_for(name, keys, regex))
            if name.startswith("chat:") and OWNED & set(keys):
                url += "?before=999999" if name == "chat:transcript_hx" else ""
            for role in ROLES:
                for method in ("get", "post"):
                    if method == "post" and (role == "owner" or role == "staff" and name.startswith("admin:")):
                        continue  # what she (or staff in the admin) may do is the views' tests; this is about refusals
                    with self.subTest(url=url, role=role, method=method):
                        response = getattr(self.client_for(role), method)(url)
                        self.check(name, keys, route, role, method, response)
                        checked += 1
        assert self.snapshot() == before, "a request that should have been refused changed Alice's data"
        assert checked > 200
        owned_urls = {name for name, keys, _, _ in chat if OWNED & set(keys)}
        assert self.refused == owned_urls, f"never a 404 to others: {owned_urls - self.refused}"

    def check(self, name, keys, route, role, method, response) -> None:
        status = response.status_code
        assert status < 500
        if role != "owner" and not (role == "staff" and name.startswith("admin:")):
            assert SECRET not in self.body(response), "someone else saw Alice's words"
        if name.startswith("admin:"):
            if name in ("admin:login", "admin:logout", "admin:jsi18n"):
                return  # the admin's sign-in pages and its translations: anyone's
            if role != "staff":
                assert status == 302 and response["Location"].startswith("/admin/login/"), status
            return  # staff: anything but a server error
        if role == "anonymous":
            if name not in PUBLIC:
                assert status == 302 and response["Location"].startswith("/accounts/login/"), status
        elif OWNED & set(keys):
            if role == "owner":
                assert status not in (403, 404), status
            else:
                assert status in (404, 405), status  # 405: the method is refused before anything is looked up
                if status == 404:
                    self.refused.add(name)

    def test_the_socket_routes(self):
        async def connect(path: str, role: str):
            user = {"owner": self.alice, "other": self.bob, "staff": self.root}.get(role)
            headers = [ORIGIN, HOST] + ([(b"cookie", await self.cookie_for(user))] if user else [])
            socket = WebsocketCommunicator(application, path, headers=headers)
            connected, code = await socket.connect(timeout=5)
            await socket.disconnect()
            return (True, None) if connected else (False, code)

        routes = [str(pattern.pattern) for pattern in websocket_urlpatterns]
        assert routes
        expected = {"owner": (True, None), "other": (False, 4403), "anonymous": (False, 4401), "staff": (False, 4403)}
        for route in routes:
            if route in ("", "^"):  # the catch-all: any other path is refused for everyone, like an unknown URL
                path, wanted = "/ws/nowhere/", dict.fromkeys(ROLES, (False, 4404))
            elif "session_id" not in route:  # a new chat's landing: anyone signed in, and it names nothing of Alice's
                path, wanted = "/" + route, {**dict.fromkeys(ROLES, (True, None)), "anonymous": (False, 4401)}
            else:
                path, wanted = "/" + re.sub(r"<(?:\w+:)?session_id>", self.session.session_id, route), expected
            assert "<" not in path, f"{route}: teach this test what its parameters take"
            for role in ROLES:
                with self.subTest(route=route, role=role):
                    assert async_to_sync(connect)(path, role) == wanted[role]


class TestSocketOrigin(LiveTestMixin, TransactionTestCase):
    """A socket opens only from a page of this site: the Origin's scheme, host and port must be the request's
    own (or one of CSRF_TRUSTED_ORIGINS), as Django's CSRF check asks of a POST."""

    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, component_id="general")

    async def opens(self, origin: bytes, host: bytes = b"127.0.0.1:8822", scheme: str = "ws") -> bool:
        headers = [(b"origin", origin), (b"host", host), (b"cookie", await self.cookie_for(self.alice))]
        socket = WebsocketCommunicator(application, f"/ws/sessions/{self.session.session_id}/", headers=headers)
        socket.scope["scheme"] = scheme
        connected, _ = await socket.connect(timeout=5)
        await socket.disconnect()
        return connected

    async def test_only_the_sites_own_origin_opens_a_socket(self):
        assert await self.opens(b"http://127.0.0.1:8822")
        for origin in (b"http://127.0.0.1:9999", b"ftp://127.0.0.1:8822", b"http://evil.example@127.0.0.1:8822",
                       b"https://127.0.0.1:8822", b"http://evil.example", b"null", b"", b"http://127.0.0.1:8822/x",
                       b"http://127.0.0.1:99999"):
            with self.subTest(origin=origin):
                assert not await self.opens(origin)
        assert await self.opens(b"https://127.0.0.1", host=b"127.0.0.1", scheme="wss")  # behind TLS
        assert not await self.opens(b"http://127.0.0.1", host=b"127.0.0.1", scheme="wss")

    @override_settings(CSRF_TRUSTED_ORIGINS=["https://127.0.0.1:8443"])
    async def test_a_trusted_origin_opens_a_socket(self):
        assert await self.opens(b"https://127.0.0.1:8443")  # a page served through another port, trusted
        assert not await self.opens(b"http://127.0.0.1:8443")
