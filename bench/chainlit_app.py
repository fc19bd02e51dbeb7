"""The minimal Chainlit app bench/chainlit_load.py compares this project with: served by `chainlit run` from
the throwaway virtual environment (never imported by the project), with no data layer and no sign-in.

Each message streams the model's reply with `stream_token` per delta, the chat's messages kept in the
user session and sent as history, as Chainlit's own examples do. The model is the bench's fake one
(OPENAI_BASE_URL).
"""

import os

import chainlit as cl
from openai import AsyncOpenAI

client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="bench", timeout=120)


@cl.on_chat_start
async def start() -> None:
    cl.user_session.set("history", [{"role": "system", "content": "You are a helpful assistant."}])


@cl.on_message
async def reply(message: cl.Message) -> None:
    history = cl.user_session.get("history")
    history.append({"role": "user", "content": message.content})
    answer = cl.Message(content="")
    stream = await client.chat.completions.create(model="bench", messages=history, stream=True)
    async for chunk in stream:
        if chunk.choices and (delta := chunk.choices[0].delta.content):
            await answer.stream_token(delta)
    history.append({"role": "assistant", "content": answer.content})
    await answer.send()
