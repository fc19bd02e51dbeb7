"""chatapp/state_view.py as strings: the state tree, its patch operations as lines, a change's source."""

from __future__ import annotations

from chatapp import state_view
from tests.web.test_rendering import assert_harmless


class TestStateTree:
    def test_lists_nested_objects_and_changed_keys(self):
        html = state_view.tree({"list": ["a", 2, True, None], "nested": {"deep": {"x": []}}, "n": 1.5},
                               changed_keys=["nested"])
        assert '<ol class="state-list" start="0"><li><span class="json-string">a</span></li>' in html
        assert '<span class="json-number">2</span>' in html and '<span class="json-literal">true</span>' in html
        assert '<span class="json-literal">null</span>' in html
        assert '<div class="state-entry changed" data-key="nested">' in html
        assert '<div class="state-entry" data-key="list">' in html
        assert html.count('<details class="state-object" open>') == 2
        assert '<span class="json-empty">empty list</span>' in html

    def test_keys_and_values_are_escaped(self):
        html = state_view.tree({"<b>key": "<script>alert(1)</script>"})
        assert "&lt;b&gt;key" in html and "&lt;script&gt;" in html
        assert_harmless(html)

    def test_very_deep_values_are_shown_as_json(self):
        deep = {}
        for _ in range(30):
            deep = {"d": deep}
        html = state_view.tree({"root": deep})
        assert html.count("<details") == state_view.MAX_DEPTH + 1  # depths 0..MAX_DEPTH, then JSON text
        assert "<code>{&quot;d&quot;: {&quot;d&quot;" in html

    def test_an_empty_state(self):
        assert "The state is empty." in state_view.tree({})

    def test_patch_operations_read_as_lines(self):
        assert state_view.readable_path("/shopping_list/0") == "shopping_list[0]"
        assert state_view.readable_path("/notes/title") == "notes.title"
        assert state_view.readable_path("/a~1b") == "a/b"
        assert state_view.describe_op({"op": "add", "path": "/l/1", "value": "eggs"}) == {
            "op": "add", "symbol": "+", "path": "l[1]", "value": '"eggs"'}
        assert state_view.describe_op({"op": "move", "from": "/a", "path": "/b"})["source"] == "a"
        long = state_view.describe_op({"op": "replace", "path": "/x", "value": "y" * 500})["value"]
        assert len(long) == state_view.VALUE_CHARS and long.endswith("…")


def test_a_changes_source_is_labelled_in_a_readers_words():
    from chatapp.state_view import source_label

    assert source_label("member:Status tracker/tool:update_step_status") == "Status tracker › update_step_status"
    assert source_label("step:Tally/function") == "Tally › function"
    assert source_label("tool:add_item") == "add_item"
    assert (source_label("manual"), source_label("branch:switch"), source_label("agentic")) == (
        "your edit", "version switch", "the assistant")
    assert source_label("step:Shopping assistant/agentic") == "Shopping assistant › the assistant"
