"""Simulated users of the Chainlit app (bench/chainlit_app.py), over Chainlit's socket.io protocol as its
web page speaks it. Run by bench/chainlit_load.py with the throwaway venv's Python (python-socketio's
asyncio client and aiohttp come from there, never from the project's requirements).

    chainlit_client.py PORT TOKENS TIMEOUT TYPING

Reads commands on stdin, answers each with one JSON line on stdout (a list of turns, as
bench/chainlit_load.py's `Turn` fields):
    new N   N new chats: each sets its sticky session cookie and connects its socket (not timed), as
            the page does when it opens; then, TYPING seconds after the last has, all send their first
            message at once
    open    the chats of the last `new` send again, at once
    close   those chats disconnect
A page's handshake: POST /set-session-cookie {session_id}, then socket.io at /ws/socket.io (websocket
transport) with auth {clientType: "webapp", sessionId, threadId, userEnv, chatProfile} and the cookie
X-Chainlit-Session-id, then the "connection_successful" event, which the server answers with
"task_end" before it runs the app's on_chat_start. A message is the "client_message"
event {message: {id (uuid4), threadId, name, type: "user_message", output, createdAt}, fileReferences};
the reply comes as "stream_start" (the step, with its first token) and "stream_token" events; the
"task_end" after them ends it.
"""

import asyncio
import json
import sys
import time
import uuid
from datetime import UTC, datetime

import aiohttp
import socketio


class Chat:
    def __init__(self, port: int, number: int):
        self.port, self.number, self.turns = port, number, 0
        self.session_id = str(uuid.uuid4())
        self.socket = socketio.AsyncClient(reconnection=False)
        self.turn: dict | None = None
        self.sent = 0.0
        self.previous: float | None = None
        self.done = asyncio.Event()
        self.ready = asyncio.Event()  # the server has taken the connection (its first task_end)
        self.socket.on("stream_start", self.stream_start)
        self.socket.on("stream_token", self.stream_token)
        self.socket.on("task_end", self.task_end)

    async def open(self) -> None:
        cookie = {"X-Chainlit-Session-id": self.session_id}
        async with aiohttp.ClientSession(cookies=cookie) as http:  # the page's sticky-session cookie
            async with http.post(f"http://127.0.0.1:{self.port}/set-session-cookie",
                                 json={"session_id": self.session_id}) as response:
                response.raise_for_status()
        await self.socket.connect(f"http://127.0.0.1:{self.port}", socketio_path="/ws/socket.io",
                                  transports=["websocket"], wait_timeout=120,
                                  headers={"Cookie": f"X-Chainlit-Session-id={self.session_id}"},
                                  auth={"clientType": "webapp", "sessionId": self.session_id, "threadId": "",
                                        "userEnv": "{}", "chatProfile": ""})
        await self.socket.emit("connection_successful")
        # Sent as the server handles that event, right before it starts on_chat_start: a person cannot
        # type before the page shows the chat, so no message goes ahead of it.
        async with asyncio.timeout(120):
            await self.ready.wait()

    def arrived(self, words: int) -> None:
        now = time.perf_counter()
        if self.previous is None:
            self.turn["first"] = now - self.sent
        else:
            self.turn["gaps"].append(now - self.previous)
        self.previous = now
        self.turn["last"] = now - self.sent
        self.turn["words"] += words

    async def stream_start(self, step: dict) -> None:
        if self.turn is not None:
            self.arrived(1 if step.get("output") else 0)

    async def stream_token(self, token: dict) -> None:
        if self.turn is not None:
            self.arrived(1)

    async def task_end(self, _data=None) -> None:
        if self.turn is None:
            self.ready.set()
        elif self.previous is not None:
            self.done.set()

    async def send(self, timeout: float) -> dict:
        self.turns += 1
        text = f"Tell me about load, part {self.turns} ({self.session_id})."
        self.turn = {"text": text, "sent_at": time.time(), "first": None, "last": None, "gaps": [], "words": 0,
                     "error": ""}
        self.previous, turn = None, self.turn
        self.done.clear()
        message = {"id": str(uuid.uuid4()), "threadId": "", "name": "User", "type": "user_message", "output": text,
                   "createdAt": datetime.now(UTC).isoformat().replace("+00:00", "Z")}
        self.sent = time.perf_counter()
        try:
            await self.socket.emit("client_message", {"message": message, "fileReferences": []})
            async with asyncio.timeout(timeout):
                await self.done.wait()
        except Exception as exc:  # noqa: BLE001 - a client's failure is a figure
            turn["error"] = f"{type(exc).__name__}: {exc}"[:200]
        self.turn = None
        return turn


async def main() -> None:
    port, tokens, timeout, typing = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    chats: list[Chat] = []
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        command, _, count = line.partition(" ")
        turns: list[dict] = []
        if command == "new":
            await asyncio.gather(*(chat.socket.disconnect() for chat in chats))
            chats = [Chat(port, number) for number in range(int(count))]
            opened = await asyncio.gather(*(chat.open() for chat in chats), return_exceptions=True)
            for chat, failed in zip(chats, opened, strict=True):
                if isinstance(failed, Exception):
                    chat.turns = -1
                    chat.error = f"connect: {type(failed).__name__}: {failed}"[:200]
            await asyncio.sleep(typing)
        if command in ("new", "open"):
            live = [chat for chat in chats if chat.turns >= 0]
            turns = list(await asyncio.gather(*(chat.send(timeout) for chat in live)))
            turns += [{"error": chat.error} for chat in chats if chat.turns < 0]
            for turn in turns:
                if not turn["error"] and turn.get("words") != tokens:
                    turn["error"] = f"{turn.get('words')} of {tokens} words"
        if command == "close":
            await asyncio.gather(*(chat.socket.disconnect() for chat in chats))
            chats = []
        print(json.dumps(turns), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
