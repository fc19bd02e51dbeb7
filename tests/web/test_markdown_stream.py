"""A streaming reply's markdown (chatapp/markdown_stream.py): at every point of the stream the browser's
reply, built from the frames as live.js builds it, equals the final render of the text so far."""

from __future__ import annotations

import pytest

from chatapp.markdown_stream import ReplyStream
from chatapp.rendering import render_markdown
from tests.support.live_support import apply_frame as apply
from tests.web.test_rendering import ATTACKS, assert_harmless

SAMPLE = """## A heading

Some **bold** text and *emphasis*, `code`, and a [link](https://example.com).
A second line of the same paragraph.

- item one
- item two
  continued

- item three (the list is loose now)

1. first
2. second

```python
def f(x):
    return "a\\nb"  # a comment
```

| a | b |
|---|:-:|
| 1 | 2 |

> a quote
lazy continuation

Setext heading
--------------

***

    indented code

Text with ![alt text](https://example.com/i.png) and <b>raw html</b>.
Final words."""

SAMPLES = {
    "mixed": SAMPLE,
    "crlf and nul": SAMPLE.replace("\n", "\r\n").replace("Final", "Fi\0nal"),
    "lone cr": "# Title\r\rpara one\r\r- a\r- b\r",
    "reference link": "See [the docs][d] first.\n\nMore text.\n\n[d]: https://example.com/docs\n\nAfter.",
    "open fence": "Intro.\n\n```js\nconst a = 1;\n\nconst b = 2;\n",
}


def stream(text: str, step: int):
    """Feed `text` `step` characters at a time; yield (text so far, the frames' reply, the stream)."""
    state, reply, have = ReplyStream(), [], 0
    for end in [*range(1, len(text), step), len(text)]:
        state.feed(text[:end])
        keep, html = state.frame(have)
        reply, have = apply(reply, keep, html), len(state.segments)
        yield text[:end], reply, state


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("step", [1, 5, 40])
def test_the_live_reply_equals_the_final_render_at_every_point(name, step):
    for text, reply, _ in stream(SAMPLES[name], step):
        assert "".join(reply) == render_markdown(text), repr(text[-30:])


def test_completed_blocks_are_rendered_once_and_the_open_one_again():
    _, _, state = list(stream(SAMPLE, 1))[-1]
    assert len(state.segments) >= 8  # the heading, the paragraph, the lists, the code... each completed once
    assert state.stable_chars == SAMPLE.index("Text with")
    assert state.tail == render_markdown(SAMPLE[state.stable_chars:])
    # A browser that has every completed block is sent only the open one.
    keep, html = state.frame(len(state.segments))
    assert keep == state.elements[-1] and html == state.tail


def test_an_open_fence_is_a_code_block_while_it_streams():
    text = "Intro.\n\n```python\ndef f():\n    return 1\n"
    state = ReplyStream()
    state.feed(text)
    assert '<span class="code-lang">python</span>' in state.tail and '<span class="k">def</span>' in state.tail
    assert state.segments == [render_markdown("Intro.\n\n")]


def test_a_reference_definition_redraws_the_reply_whole():
    text = SAMPLES["reference link"]
    frames = []
    state, have = ReplyStream(), 0
    for end in range(1, len(text) + 1):
        state.feed(text[:end])
        frames.append(state.frame(have))
        have = len(state.segments)
    assert state.whole and frames[-1][0] == 0  # keep nothing: the link above changed
    assert '<a href="https://example.com/docs"' in frames[-1][1]


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_same_sanitizer_applies_mid_stream(attack):
    for _, reply, _ in stream(f"Hello\n\n{attack}\n\nbye", 1):
        assert_harmless("".join(reply))
