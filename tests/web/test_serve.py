"""The production start (scripts/serve): uvicorn with DEBUG off behind the security headers, static
files served by the app, error pages that reveal nothing, and a chat that streams over the socket."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from django.test import Client

from chatapp.rendering import render_markdown
from tests.e2e.conftest import _free_port, _test_database_url, redis_url  # noqa: F401  (a fixture)
from tests.support.factories import make_session, make_user
from tests.support.live_support import is_stream_frame, reply_in, stored_text, streamed_html
from tests.support.llm_server import Text, background_responder
from tests.support.serve_support import HTTPS, Server, WebSocket, finished, logged_in_socket, production_env, receive_until

BASE_DIR = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def static_root():
    with tempfile.TemporaryDirectory(prefix="static-") as folder:
        yield folder


# uvicorn pings every socket (every 20 s by default) and closes one that does not answer in time: these
# servers ping often, so every socket test here meets pings and the test client must answer them.
PINGS_OFTEN = {"UVICORN_WS_PING_INTERVAL": "0.5", "UVICORN_WS_PING_TIMEOUT": "5"}


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker, llm_server_session, static_root):
    env = production_env(DATABASE_URL=_test_database_url(), STATIC_ROOT=static_root, **PINGS_OFTEN,
                         OPENAI_BASE_URL=llm_server_session.base_url, OPENAI_API_KEY="test", OPENAI_TIMEOUT="10")
    server = Server(["bash", "scripts/serve"], env)
    yield server
    server.stop()


def test_it_refuses_to_start_without_a_secret_key_or_hosts():
    for missing in ("SECRET_KEY", "ALLOWED_HOSTS"):
        env = production_env()
        env.pop(missing)
        result = subprocess.run(["bash", "scripts/serve"], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode != 0 and f"{missing}: must be set" in result.stderr


def test_it_refuses_to_believe_forwarded_addresses_from_anyone_unless_told_twice():
    result = subprocess.run(["bash", "scripts/serve"], cwd=BASE_DIR, env=production_env(FORWARDED_ALLOW_IPS="*"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "FORWARDED_ALLOW_IPS=* with TRUST_PROXY_HEADERS=true" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_a_forged_forwarded_address_from_a_client_that_is_not_the_proxy_is_not_believed(static_root):
    """Sign-ins count per client address. By default only the loopback address (127.0.0.1, ::1) is the
    proxy: a client at 127.0.0.2 that names a new address in each request is still one address."""
    env = production_env(DATABASE_URL=_test_database_url(), STATIC_ROOT=static_root,
                         CHAT_LOGINS_PER_ADDRESS_PER_HOUR="2")
    server = Server(["bash", "scripts/serve"], env)
    try:
        def sign_in(source: str, forged: str) -> int:
            return server.post_form("/accounts/login/", {"username": "nobody", "password": "wrong"}, {},
                                    {"X-Forwarded-For": forged}, source)[0]

        # The proxy's word is taken: each address has its own allowance.
        from_the_proxy = [sign_in("127.0.0.1", f"198.51.100.{number}") for number in range(3)]
        # Anyone else's is not: three attempts from 127.0.0.2, over its limit of two.
        from_a_client = [sign_in("127.0.0.2", f"203.0.113.{number}") for number in range(3)]
    finally:
        server.stop()
    assert from_the_proxy == [200, 200, 200]  # a wrong password shows the form again
    assert from_a_client == [200, 200, 429]


def test_the_pages_carry_the_security_headers(served):
    status, headers, body = served.get("/accounts/login/", HTTPS)
    assert status == 200, body
    assert headers["strict-transport-security"] == "max-age=31536000; includeSubDomains; preload"
    policy = headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert headers["x-content-type-options"] == "nosniff" and headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "same-origin"
    assert "Secure" in headers["set-cookie"] and "csrftoken" in headers["set-cookie"]
    # Plain HTTP is sent to HTTPS.
    status, headers, _ = served.get("/accounts/login/")
    assert status == 301 and headers["location"] == "https://127.0.0.1/accounts/login/"


def test_static_files_are_collected_and_served_by_the_app(served):
    _, _, body = served.get("/accounts/login/", HTTPS)
    stylesheet = re.search(r'href="(/static/chatapp/chat\.[0-9a-f]{12}\.css)"', body).group(1)
    status, headers, css = served.get(stylesheet, HTTPS)
    assert status == 200 and headers["content-type"].startswith("text/css") and css
    assert "immutable" in headers["cache-control"]
    for script in re.findall(r'<script src="([^"]+)"', body):
        assert re.fullmatch(r"/static/[\w/.-]+\.[0-9a-f]{12}\.js", script), script
        assert served.get(script, HTTPS)[0] == 200


def test_a_404_reveals_nothing(served):
    status, _, body = served.get("/no/such/page/", HTTPS)
    assert status == 404
    for leak in ("URLconf", "chat:", "admin/", "accounts/", "Traceback", "DEBUG", "Django"):
        assert leak not in body, leak


def test_a_500_reveals_nothing(static_root):
    """A fault the app cannot help (its database is gone) is a bare 500 page."""
    closed = _free_port()
    env = production_env(DATABASE_URL=f"postgres://app:s3cret-pw@127.0.0.1:{closed}/app", STATIC_ROOT=static_root,
                         DEBUG="false")  # as scripts/serve sets it
    server = Server([str(BASE_DIR / ".venv/bin/python"), "-m", "daphne", "-b", "127.0.0.1", "-p", env["PORT"],
                     "chatapp.asgi:application"], env)
    try:
        status, _, body = server.get("/accounts/login/", {**HTTPS, "Cookie": "sessionid=" + "a" * 32})
    finally:
        server.stop()
    assert status == 500
    for leak in ("OperationalError", "psycopg", "Traceback", "s3cret", str(closed), "settings", "sessionid", "File "):
        assert leak not in body, leak


# -- a chat over the socket, through the production server ------------------------------------------


def session_cookie(user, settings, server: Server) -> str:
    settings.SECRET_KEY = server.secret_key  # the session cookie made here is the server's
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.mark.django_db(transaction=True)
def test_a_chat_streams_through_the_production_server(served, llm_server, settings):
    llm_server.side_responder = background_responder
    llm_server.add(Text("The production server streams this reply word by word", chunk_delay=0.02))
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Chat")
    ws = logged_in_socket(served, session, session_cookie(alice, settings, served))
    try:
        ws.send(json.dumps({"type": "send", "text": "hello"}))
        frames = receive_until(ws, finished("completed"))
    finally:
        ws.close()
        print(served.whole_output()[-20000:])  # shown when the test fails: what the server logged
    tokens = [frame for frame in frames if frame.startswith("<template data-stream-run=")]
    assert len(tokens) >= 2  # streamed in batches, not at once
    assert "word by word" in frames[-1]


@pytest.mark.django_db(transaction=True)
def test_a_socket_that_answers_the_servers_pings_stays_open(served, settings):
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Chat")
    ws = logged_in_socket(served, session, session_cookie(alice, settings, served))
    try:
        ws.answer_pings(3)
        ws.send(json.dumps({"type": "nonsense"}))
        assert "Unknown request type." in ws.receive()
    finally:
        ws.close()


# -- WEB_CONCURRENCY: worker processes on one port ----------------------------------------------------


def worker_of(server: Server, ws: WebSocket) -> int:
    """The pid of the server process holding the other end of `ws`: the kernel's table of TCP connections
    gives the socket's inode (local port the server's, remote port this client's), and the process
    whose open files include that socket is the worker that accepted it."""
    client_port = ws.sock.getsockname()[1]
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if int(local.split(":")[1], 16) == server.port and int(remote.split(":")[1], 16) == client_port:
            inodes.add(f"socket:[{inode}]")
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
    owners = {int(pid) for pid in children for fd in Path(f"/proc/{pid}/fd").iterdir()
              if os.path.islink(fd) and os.readlink(fd) in inodes}
    assert len(owners) == 1, (inodes, children, owners)
    return owners.pop()


def socket_on_worker(server: Server, connect: Callable[[], WebSocket], wanted: Callable[[int], bool],
                     attempts: int = 40) -> tuple[WebSocket, int]:
    """Connect until a socket lands on a worker `wanted` accepts (the kernel hands each new connection
    to whichever worker accepts first); the others are closed."""
    for _ in range(attempts):
        ws = connect()
        pid = worker_of(server, ws)
        if wanted(pid):
            return ws, pid
        ws.close()
    raise AssertionError(f"no socket of {attempts} landed on the worker wanted")


@pytest.fixture(scope="module")
def served_by_two(request, django_db_setup, django_db_blocker, llm_server_session, static_root):
    redis = request.getfixturevalue("redis_url")  # the browser tests' Redis (scripts/test's, or one of its own)
    env = production_env(DATABASE_URL=_test_database_url(), STATIC_ROOT=static_root, REDIS_URL=redis,
                         WEB_CONCURRENCY="2", **PINGS_OFTEN, OPENAI_BASE_URL=llm_server_session.base_url, OPENAI_API_KEY="test",
                         OPENAI_TIMEOUT="10")
    server = Server(["bash", "scripts/serve"], env)
    yield server
    server.stop()


def test_more_than_one_worker_needs_redis_and_a_count_is_a_whole_number():
    for extra, error in (({"WEB_CONCURRENCY": "2"}, "REDIS_URL: must be set"),
                         ({"WEB_CONCURRENCY": "two"}, "WEB_CONCURRENCY: expected a whole number"),
                         ({"WEB_CONCURRENCY": "0"}, "WEB_CONCURRENCY: expected a whole number")):
        result = subprocess.run(["bash", "scripts/serve"], cwd=BASE_DIR, env=production_env(**extra),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode != 0 and error in result.stderr, result.stderr


@pytest.mark.django_db(transaction=True)
def test_two_workers_on_one_port_share_a_users_runs(served_by_two, llm_server, settings):
    """Two tabs of one chat on different workers: a run started in one streams to both, a tab that
    reconnects mid-reply on the other worker gets the text the engine has stored and the rest live, a
    message queued on the other worker can be dropped from the run's, and Stop pressed in the other
    worker's tab stops the run where it runs."""
    server = served_by_two
    llm_server.side_responder = background_responder
    alice = make_user("alice")
    session = make_session(alice, component_id="general", name="Two workers", name_source="user")
    cookie = session_cookie(alice, settings, server)
    connect = lambda query="": logged_in_socket(server, session, cookie, query)  # noqa: E731
    here, owner = socket_on_worker(server, connect, lambda pid: True)
    there, other = socket_on_worker(server, connect, lambda pid: pid != owner)
    sockets = [here, there]
    try:
        # A run started on one worker streams to the tab on the other.
        hold = threading.Event()  # the reply is held after its third word, written over more than a second
        llm_server.add(Text("alpha beta gamma delta epsilon", chunk_delay=0.4, hold_after=3, wait_event=hold))
        here.send(json.dumps({"type": "send", "text": "greek letters"}))
        first = receive_until(here, is_stream_frame)
        run_id = re.search(r'data-stream-run="([\w-]+)"', first[-1]).group(1)
        assert "alpha" in first[-1]
        seen_there = receive_until(there, lambda frame: f'data-stream-run="{run_id}"' in frame)
        assert "alpha" in seen_there[-1]

        # A reload mid-reply, landing on the worker that does not run it, resumes it from the text the
        # engine has stored (some of the three words written so far).
        assert stored_text(run_id).startswith("alpha")
        query = f"?last_run={run_id}&running={run_id}&reconnect=1"
        reloaded, pid = socket_on_worker(server, lambda: connect(query), lambda pid: pid == other)
        sockets.append(reloaded)
        caught_up = receive_until(reloaded, lambda frame: f'id="run-{run_id}"' in frame)
        assert 'data-status="running"' in caught_up[-1]
        assert reply_in(caught_up[-1], run_id) in {render_markdown(text) for text in ("alpha", "alpha beta",
                                                                                       "alpha beta gamma")}
        hold.set()
        for ws in (here, there, reloaded):
            done = receive_until(ws, finished("completed"))
            assert "alpha beta gamma delta epsilon" in done[-1]
        # What the reloaded tab showed live, before the final render: the text so far, then the rest once.
        assert streamed_html(done[:-1], run_id, reply_in(caught_up[-1], run_id)) == render_markdown(
            "alpha beta gamma delta epsilon")

        # A message sent meanwhile in the tab on the other worker waits there for the run, and the tab on
        # the run's worker can drop it.
        hold = threading.Event()
        llm_server.add(Text("one two three four five", wait_event=hold), Text("The last reply."))
        here.send(json.dumps({"type": "send", "text": "count"}))
        started = receive_until(there, lambda frame: is_stream_frame(frame) and "one" in frame)
        second_run = re.search(r'data-stream-run="([\w-]+)"', started[-1]).group(1)
        there.send(json.dumps({"type": "send", "text": "dropped before it ran"}))
        # (By its text: "count" itself may be shown queued for a moment, while the run before it ends.)
        queued = receive_until(here, lambda frame: "beforeend:#queue" in frame and "dropped before" in frame)
        queued_id = re.search(r'id="queued-([\w-]+)"', queued[-1]).group(1)
        here.send(json.dumps({"type": "stop", "queued_id": queued_id}))
        for ws in (here, there):
            receive_until(ws, lambda frame: f'id="queued-{queued_id}"' in frame and "Queued message removed." in frame)

        # Stop pressed in the tab on the other worker stops the run where it runs.
        there.send(json.dumps({"type": "stop", "run_id": second_run}))
        for ws in (here, there):
            assert f'id="run-{second_run}"' in receive_until(ws, finished("cancelled"))[-1]
        assert llm_server.wait_for_disconnects(1, 5)  # the model's stream was closed by the worker running it
        hold.set()
        there.send(json.dumps({"type": "send", "text": "the last one"}))  # runs after the dropped one would have
        assert "The last reply." in receive_until(there, finished("completed"))[-1]
    finally:
        for ws in sockets:
            ws.close()
        print(server.whole_output()[-20000:])  # shown when the test fails: what the two workers logged
    runs = list(session.runs.order_by("pk"))
    assert [(run.run_id, run.status) for run in runs[:2]] == [(run_id, "completed"), (second_run, "cancelled")]
    assert runs[0].content == "alpha beta gamma delta epsilon" and runs[1].content.startswith("one")
    assert [run.input for run in runs] == ["greek letters", "count", "the last one"]  # the dropped one never ran
