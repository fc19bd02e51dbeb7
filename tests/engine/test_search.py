"""sessions_core.search: titles then messages, with their matches (shown escaped and marked by chatapp),
scoped to the user, always current."""

import importlib
import re
from datetime import timedelta
from unittest import mock

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase, override_settings
from django.utils import timezone

from sessions_core import Agent, search
from sessions_core.llm import OfflineModel
from sessions_core.models import ChatSession, Message, Run
from chatapp.templatetags.search_snippets import marked
from sessions_core.search import InvalidCursor, Snippet, fts5, parse_query, search_sessions, similarity
from tests.support.factories import make_run, make_session


def make_user(username):
    """A user without a password: hashing one costs more than a whole search test."""
    return get_user_model().objects.create_user(username)


MARKUP = re.compile(r"</?[a-z][^>]*>", re.IGNORECASE)


def tags(html: str) -> set[str]:
    return set(MARKUP.findall(html))


def names(hits) -> list[str]:
    return [hit.session.name for hit in hits]


def add_message(session, role, content):
    """A message of another role inside a fresh run (system prompts, tool output)."""
    run = Run.objects.create(session=session, status="completed")
    session.last_seq += 1
    session.save(update_fields=["last_seq"])
    return Message.objects.create(session=session, run=run, seq=session.last_seq, role=role, content=content)


class SearchTestCase(TestCase):
    def setUp(self):
        self.alice = make_user("alice")
        self.bob = make_user("bob")


class TestQueryParsing(TestCase):
    def test_it_splits_filters_phrases_alternatives_and_exclusions(self):
        parsed = parse_query('pinned: assistant:Shopping "red car" or bike -rust')
        assert parsed.pinned and parsed.assistants == ("Shopping",)
        assert parsed.text == '"red car" or bike -rust'
        assert [[t.text for t in g] for g in parsed.groups] == [["red car", "bike"]]
        assert [t.text for t in parsed.excluded] == ["rust"]

    def test_pinned_false_is_no_filter_and_punctuation_alone_is_an_empty_query(self):
        assert not parse_query("pinned:no pasta").pinned
        assert parse_query('"" - or ,').is_empty

    def test_the_migration_indexes_the_same_text_the_queries_search(self):
        migration = importlib.import_module("sessions_core.migrations.0002_search_indexes")
        for name in ("TS_CONFIG", "INDEXED_CHARS", "MARKUP_CHARS", "MARKUP_STANDINS"):
            assert getattr(migration, name) == getattr(search, name)
        assert migration.SEARCHED_ROLES == str(tuple(str(r) for r in search.SEARCHED_ROLES))
        lazy = importlib.import_module("sessions_core.migrations.0005_message_fts_lazy")
        assert (lazy.MESSAGE_FTS, lazy.MARK, lazy.SEARCHED_ROLES) == (
            search.MESSAGE_FTS, search.MESSAGE_FTS_MARK, migration.SEARCHED_ROLES)


class TestTitlesAndContent(SearchTestCase):
    def test_title_hits_come_before_content_hits(self):
        dinner = make_session(self.alice, name="Dinner ideas")
        make_run(dinner, "Anything with risotto?", "A mushroom risotto works.")
        make_session(self.alice, name="Risotto masterclass")  # newer, and only its title matches
        page = search_sessions(self.alice, "risotto")
        assert names(page.title_hits) == ["Risotto masterclass"]
        assert names(page.message_hits) == ["Dinner ideas", "Dinner ideas"]
        assert page.title_hits[0].snippet == Snippet("Risotto masterclass", ((0, 7),))  # data, not HTML
        assert marked(page.title_hits[0].snippet) == "<mark>Risotto</mark> masterclass"
        assert not page.title_hits[0].fuzzy

    def test_a_content_hit_says_where_it_is_and_highlights_the_match(self):
        session = make_session(self.alice, name="Trip")
        make_run(session, "first question", "nothing here")
        run = make_run(session, "Which museums open on Mondays in Lisbon?", "The tile museum does.")
        [hit] = search_sessions(self.alice, "lisbon").message_hits
        assert (hit.session.pk, hit.run_id, hit.seq, hit.role) == (session.pk, run.run_id, 3, "user")
        assert "<mark>Lisbon</mark>" in marked(hit.snippet)
        assert tags(marked(hit.snippet)) == {"<mark>", "</mark>"}

    def test_words_match_their_other_forms(self):
        session = make_session(self.alice, name="Kitchen")
        make_run(session, "I love cooking stews", "Stews are great")
        assert names(search_sessions(self.alice, "cooked").message_hits) == ["Kitchen"]

    def test_a_query_of_stop_words_finds_the_words_as_typed(self):
        """PostgreSQL's English configuration drops "what", "is" and "this"; the words are still found."""
        make_run(make_session(self.alice, name="Odd"), "What is this thing on my desk?", "A stapler.")
        make_run(make_session(self.alice, name="Other"), "what about lunch", None)
        [hit] = search_sessions(self.alice, "what is this").message_hits
        assert hit.session.name == "Odd" and "<mark>" in marked(hit.snippet)

    def test_phrases_alternatives_and_exclusions(self):
        make_run(make_session(self.alice, name="A"), "a red car parked outside", None)
        make_run(make_session(self.alice, name="B"), "a red and blue car", None)
        make_run(make_session(self.alice, name="C"), "a rusty bike", None)
        assert names(search_sessions(self.alice, '"red car"').message_hits) == ["A"]
        assert names(search_sessions(self.alice, "car -blue").message_hits) == ["A"]
        assert sorted(names(search_sessions(self.alice, '"red car" or bike').message_hits)) == ["A", "C"]

    def test_excluded_words_and_alternatives_apply_to_titles_too(self):
        make_session(self.alice, name="Red car notes")
        make_session(self.alice, name="Blue car notes")
        make_session(self.alice, name="Bike 100% done")
        make_session(self.alice, name="1000 dexo things")
        assert names(search_sessions(self.alice, "car -blue").title_hits) == ["Red car notes"]
        assert names(search_sessions(self.alice, "red or bike").title_hits) == ["Bike 100% done", "Red car notes"]
        # LIKE wildcards typed by the user are literal characters.
        exact = [h.session.name for h in search_sessions(self.alice, "100%").title_hits if not h.fuzzy]
        assert exact == ["Bike 100% done"]  # "1000 dexo things" is only a similar title
        assert names(search_sessions(self.alice, "e_o").title_hits) == []

    def test_message_hits_follow_session_activity_then_newest_first(self):
        old = make_session(self.alice, name="Old")
        make_run(old, "kiwi one", None)
        new = make_session(self.alice, name="New")
        make_run(new, "kiwi two", None)
        make_run(old, "kiwi three", None)  # the old session is now the most recently active
        snippets = [marked(h.snippet) for h in search_sessions(self.alice, "kiwi").message_hits]
        assert snippets == ["<mark>kiwi</mark> three", "<mark>kiwi</mark> one", "<mark>kiwi</mark> two"]

    def test_one_hit_per_session_counts_the_rest_and_pages_on_to_the_next_session(self):
        old = make_session(self.alice, name="Old")
        make_run(old, "kiwi a", None)
        busy = make_session(self.alice, name="Busy")
        for n in range(6):
            make_run(busy, f"kiwi {n}", None)
        first = search_sessions(self.alice, "kiwi", limit=3, one_per_session=True)
        assert [(h.session.name, marked(h.snippet), h.more) for h in first.message_hits] == [
            ("Busy", "<mark>kiwi</mark> 5", 2)]
        rest = search_sessions(self.alice, "kiwi", limit=3, cursor=first.next_cursor, one_per_session=True)
        assert [(h.session.name, h.more) for h in rest.message_hits] == [("Old", 0)]  # Busy is not listed again
        assert rest.next_cursor is None
        assert len(search_sessions(self.alice, "kiwi").message_hits) == 7  # the engine's default: every message

    def test_system_prompts_and_tool_output_are_not_searched(self):
        session = make_session(self.alice, name="Tools")
        add_message(session, "system", "You are zanzibar, a helpful assistant.")
        add_message(session, "tool", "zanzibar added")
        assert search_sessions(self.alice, "zanzibar").is_empty

    def test_an_empty_query_finds_nothing(self):
        make_run(make_session(self.alice, name="Anything"), "hello", "hi")
        page = search_sessions(self.alice, "   ")
        assert page.is_empty and page.next_cursor is None


class TestTypos(SearchTestCase):
    def test_a_misspelled_title_is_found_after_exact_title_hits(self):
        make_session(self.alice, name="Pasta recipes for winter")
        make_session(self.alice, name="Sourdough starter")
        make_session(self.alice, name="Recipies I misspelled myself")
        page = search_sessions(self.alice, "recipies")
        # Both databases: trigram similarity (pg_trgm on PostgreSQL, FTS5 trigram candidates on SQLite).
        assert names(page.title_hits) == ["Recipies I misspelled myself", "Pasta recipes for winter"]
        exact, similar = page.title_hits
        assert not exact.fuzzy and similar.fuzzy
        assert marked(similar.snippet) == "Pasta <mark>recipes</mark> for winter"

    def test_similar_titles_page_closest_first_without_repeats(self):
        stamp = timezone.now()
        for name in ["Recipes A", "Recipes B", "Recipes C", "Recipe list", "Old recipes book"]:
            make_session(self.alice, name=name, last_activity_at=stamp)
        hits, cursor = [], None
        while True:
            page = search_sessions(self.alice, "recipies", limit=2, cursor=cursor)
            hits += page.title_hits
            cursor = page.next_cursor
            if not cursor:
                break
        assert sorted(names(hits)) == ["Old recipes book", "Recipe list", "Recipes A", "Recipes B", "Recipes C"]
        assert all(hit.fuzzy for hit in hits)
        assert [hit.rank for hit in hits] == sorted(hit.rank for hit in hits)

    def test_two_swapped_letters_are_a_typo_on_both_databases(self):
        make_session(self.alice, name="Pancakes for Sunday")
        make_session(self.alice, name="Pan fried fish")
        page = search_sessions(self.alice, "panckaes")  # trigrams alone rate it 0.44
        assert names(page.title_hits) == ["Pancakes for Sunday"]
        assert page.title_hits[0].fuzzy and marked(page.title_hits[0].snippet) == "<mark>Pancakes</mark> for Sunday"
        assert search.title_similarity(["panckaes"], "Pancakes for Sunday") == 0.875
        assert search.title_similarity(["pcnkaaes"], "Pancakes") < search.TITLE_SIMILARITY  # three edits

    def test_sqlites_trigram_figure_is_pg_trgms_word_similarity(self):
        """SQLite has no pg_trgm: similarity.word_similarity computes its figure (the expected values are
        what PostgreSQL's word_similarity returns, and the PostgreSQL pass asks it)."""
        expected = {
            ("recipies", "Pasta recipes for winter"): 0.555556,
            ("panckaes", "Pancakes for Sunday"): 0.444444,
            ("itinerery", "Holiday itinerary"): 0.6,
            ("budget plan", "Quarterly budget review"): 0.583333,
            ("word", "two words here"): 0.8,
            ("sunday pancakes", "Pancakes for Sunday"): 0.8,
        }
        assert {pair: round(similarity.word_similarity(*pair), 6) for pair in expected} == expected
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                for pair, figure in expected.items():
                    cursor.execute("SELECT word_similarity(%s, %s)", pair)
                    assert round(cursor.fetchone()[0], 6) == figure

    def test_a_dissimilar_title_is_not_a_typo_match(self):
        make_session(self.alice, name="Quarterly budget review")
        assert search_sessions(self.alice, "recipies").is_empty

    @override_settings(SESSIONS_SEARCH_BACKEND="basic")
    def test_the_like_fallback_has_no_typo_tolerance_but_finds_substrings(self):
        make_session(self.alice, name="Pasta recipes for winter")
        session = make_session(self.alice, name="Dinner")
        make_run(session, "Tell me about <b>gnocchi</b> please", None)
        assert search_sessions(self.alice, "recipies").is_empty
        assert names(search_sessions(self.alice, "recipe").title_hits) == ["Pasta recipes for winter"]
        [hit] = search_sessions(self.alice, "gnocchi").message_hits
        assert marked(hit.snippet) == "Tell me about &lt;b&gt;<mark>gnocchi</mark>&lt;/b&gt; please"


class TestFilters(SearchTestCase):
    def test_pinned_and_assistant_filters(self):
        pinned = make_session(self.alice, name="Groceries pinned", pinned_at=timezone.now(), component_id="shopping")
        make_run(pinned, "buy oat milk", None)
        general = make_session(self.alice, name="Groceries chat", component_id="general")
        make_run(general, "oat milk or soy?", None)
        assert names(search_sessions(self.alice, "pinned: groceries").title_hits) == ["Groceries pinned"]
        assert names(search_sessions(self.alice, "pinned: oat").message_hits) == ["Groceries pinned"]
        assert names(search_sessions(self.alice, "assistant:general oat").message_hits) == ["Groceries chat"]
        assert names(search_sessions(self.alice, "assistant:shopping assistant:general milk").message_hits) == [
            "Groceries chat", "Groceries pinned"]

    def test_filters_alone_list_the_matching_sessions_newest_first(self):
        make_session(self.alice, name="Old pin", pinned_at=timezone.now(),
                     last_activity_at=timezone.now() - timedelta(days=2))
        make_session(self.alice, name="New pin", pinned_at=timezone.now())
        make_session(self.alice, name="Not pinned")
        page = search_sessions(self.alice, "pinned:")
        assert names(page.title_hits) == ["New pin", "Old pin"] and page.message_hits == []


class TestScope(SearchTestCase):
    def test_another_users_sessions_never_appear(self):
        theirs = make_session(self.bob, name="Secret recipes of bob")
        make_run(theirs, "secret recipes inside", "secret recipes reply")
        assert search_sessions(self.alice, "secret recipes").is_empty
        assert search_sessions(self.alice, "secret recipies").is_empty  # not through the typo path either
        assert names(search_sessions(self.bob, "secret").title_hits) == ["Secret recipes of bob"]

    def test_ownerless_sessions_are_not_a_users(self):
        make_run(make_session(None, name="Script session"), "script words", None)
        assert search_sessions(self.alice, "script").is_empty
        assert names(search_sessions(None, "script").title_hits) == ["Script session"]

    def test_soft_deleted_sessions_are_excluded_until_restored(self):
        session = make_session(self.alice, name="Tax return")
        make_run(session, "deductions for 2025", None)
        session.deleted_at = timezone.now()
        session.save(update_fields=["deleted_at"])
        assert search_sessions(self.alice, "tax").is_empty
        assert search_sessions(self.alice, "deductions").is_empty
        session.deleted_at = None
        session.save(update_fields=["deleted_at"])
        assert names(search_sessions(self.alice, "deductions").message_hits) == ["Tax return"]


class TestIndexStaysInStep(SearchTestCase):
    def test_a_rename_shows_at_once_including_typo_matches(self):
        session = make_session(self.alice, name="Untitled")
        search_sessions(self.alice, "untitled")
        session.name = "Holiday itinerary"
        session.save(update_fields=["name"])
        assert search_sessions(self.alice, "untitled").is_empty
        assert names(search_sessions(self.alice, "holiday").title_hits) == ["Holiday itinerary"]
        assert names(search_sessions(self.alice, "itinerery").title_hits) == ["Holiday itinerary"]

    def test_a_new_message_shows_at_once(self):
        session = make_session(self.alice, name="Notes")
        assert search_sessions(self.alice, "quokka").is_empty
        make_run(session, "Tell me about the quokka", "A small marsupial.")
        assert names(search_sessions(self.alice, "quokka").message_hits) == ["Notes"]

    def test_an_edited_message_is_searched_by_its_new_text(self):
        session = make_session(self.alice, name="Notes")
        make_run(session, "original wording", None)
        Message.objects.filter(session=session).update(content="revised phrasing")
        assert search_sessions(self.alice, "original").is_empty
        assert names(search_sessions(self.alice, "revised").message_hits) == ["Notes"]

    def test_a_hard_delete_removes_the_session_and_its_messages_from_the_index(self):
        session = make_session(self.alice, name="Ephemeral")
        make_run(session, "walrus facts", "walrus reply")
        assert names(search_sessions(self.alice, "walrus").message_hits) == ["Ephemeral", "Ephemeral"]
        session.delete()
        assert search_sessions(self.alice, "walrus").is_empty
        assert search_sessions(self.alice, "ephemeral").is_empty
        if connection.vendor == "sqlite":  # the FTS5 tables themselves forgot the rows (the triggers ran)
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {search.MESSAGE_FTS} WHERE {search.MESSAGE_FTS} MATCH 'walrus'")
                assert cursor.fetchone()[0] == 0
                table = search.NAME_TRIGRAMS
                cursor.execute(f"SELECT count(*) FROM {table} WHERE {table} MATCH 'hemeral'")
                assert cursor.fetchone()[0] == 0


class TestEscaping(SearchTestCase):
    def test_html_in_messages_and_titles_is_escaped_in_snippets(self):
        session = make_session(self.alice, name='<img src=x onerror="alert(1)"> xsstoken plans')
        make_run(session, 'look <script>alert("x")</script> xsstoken & <b>more</b>', None)
        page = search_sessions(self.alice, "xsstoken")
        assert '<script>alert("x")</script>' in page.message_hits[0].snippet.text  # the engine returns the text
        for snippet in [marked(page.title_hits[0].snippet), marked(page.message_hits[0].snippet)]:
            assert tags(snippet) == {"<mark>", "</mark>"}, snippet
        escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; <mark>xsstoken</mark> &amp;"
        assert escaped in marked(page.message_hits[0].snippet)
        assert marked(page.title_hits[0].snippet).startswith("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;")

    def test_highlight_markers_typed_by_the_user_cannot_unbalance_the_markup(self):
        session = make_session(self.alice, name="Odd \ue001characters\ue000 here")
        make_run(session, "odd \ue000\ue001\ue000 characters", None)
        page = search_sessions(self.alice, "characters")
        for snippet in [marked(page.title_hits[0].snippet), marked(page.message_hits[0].snippet)]:
            assert snippet.count("<mark>") == snippet.count("</mark>") >= 1
            assert "\ue000" not in snippet and "\ue001" not in snippet


class TestPagination(SearchTestCase):
    def test_pages_cover_every_hit_once_titles_first_even_with_equal_timestamps(self):
        stamp = timezone.now()
        for i in range(7):
            make_session(self.alice, name=f"Budget {i}", last_activity_at=stamp)
        make_session(self.alice, name="Budgte typo")  # a fuzzy title hit, after the exact ones
        other = make_session(self.alice, name="Ledger")
        for i in range(9):
            make_run(other, f"budget line {i}", None)
        seen, kinds, cursor, pages = [], [], None, 0
        while True:
            page = search_sessions(self.alice, "budget", limit=4, cursor=cursor)
            pages += 1
            assert pages == 1 or not page.first
            seen += [("t", h.session.pk) for h in page.title_hits] + [("m", h.message_id) for h in page.message_hits]
            kinds += [h.fuzzy for h in page.title_hits] + ["m"] * len(page.message_hits)
            cursor = page.next_cursor
            if not cursor:
                break
        assert len(seen) == len(set(seen)) == 7 + 1 + 9
        assert kinds == [False] * 7 + [True] + ["m"] * 9
        assert pages == 5
        message_ids = [pk for kind, pk in seen if kind == "m"]
        assert message_ids == sorted(message_ids, reverse=True)  # newest first

    def test_a_page_filled_by_titles_still_leads_on_to_the_messages(self):
        make_session(self.alice, name="Alpha")
        make_run(make_session(self.alice, name="Other"), "alpha inside", None)
        first = search_sessions(self.alice, "alpha", limit=1)
        assert names(first.title_hits) == ["Alpha"] and first.next_cursor
        second = search_sessions(self.alice, "alpha", limit=1, cursor=first.next_cursor)
        assert names(second.message_hits) == ["Other"] and second.next_cursor is None
        assert second.continues_messages

    def collect(self, query, limit):
        hits, cursor = [], None
        while True:
            page = search_sessions(self.alice, query, limit=limit, cursor=cursor)
            hits += [h.message_id for h in page.message_hits]
            cursor = page.next_cursor
            if not cursor:
                return hits

    def test_message_pages_across_sessions_sharing_a_timestamp(self):
        sessions = [make_session(self.alice, name=f"S{i}") for i in range(3)]
        for session in sessions:
            for j in range(3):
                make_run(session, f"mango {j}", None)
        ChatSession.objects.filter(pk__in=[s.pk for s in sessions]).update(last_activity_at=timezone.now())
        expected = list(Message.objects.filter(session__in=sessions).order_by("-session_id", "-seq")
                        .values_list("pk", flat=True))
        assert self.collect("mango", limit=2) == expected
        # SQLite has two plans (start from the index, or walk the sessions): both give the same pages.
        with mock.patch.object(fts5, "FTS5_DRIVING_LIMIT", 1):
            assert self.collect("mango", limit=2) == expected

    def test_a_forged_cursor_is_rejected(self):
        for cursor in ["x", "t.0.abc.1", "m.1.2", "m.1.2.x", "t.0.99999999999999999999999.1"]:
            with pytest.raises(InvalidCursor):
                search_sessions(self.alice, "budget", cursor=cursor)


class TestMigration(TransactionTestCase):
    def search_objects(self) -> set[str]:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname IN "
                               "('message_search_vector_idx', 'session_name_trgm_idx') UNION "
                               "SELECT column_name FROM information_schema.columns "
                               "WHERE column_name = 'search_vector'")
            else:
                cursor.execute("SELECT name FROM sqlite_master WHERE name LIKE 'sessions_core_%_fts%' "
                               "OR name LIKE 'sessions_core_%_trgm%'")
            return {row[0] for row in cursor.fetchall()}

    def test_it_reverses_and_reapplies_and_indexes_existing_rows(self):
        expected = self.search_objects()
        if connection.vendor == "postgresql":
            assert expected == {"message_search_vector_idx", "session_name_trgm_idx", "search_vector"}
        else:
            assert {search.MESSAGE_FTS, search.MESSAGE_FTS_MARK, search.NAME_TRIGRAMS} <= expected
            assert "sessions_core_message_fts_ai" not in expected
        try:
            call_command("migrate", "sessions_core", "0001", verbosity=0)
            assert self.search_objects() == set()
            alice = make_user("alice")
            make_run_at("0001", make_session_at("0001", alice, "Written before the index"), "platypus")
        finally:  # every app: going back unapplied the migrations that depend on these (chatapp's)
            call_command("migrate", verbosity=0)
        assert self.search_objects() == expected
        page = search_sessions(alice, "platypus")
        assert names(page.message_hits) == ["Written before the index"]
        assert names(search_sessions(alice, "index").title_hits) == ["Written before the index"]

    def test_going_back_to_0004_indexes_what_no_search_had_and_coming_back_marks_everything_indexed(self):
        """SQLite: 0005 reversed indexes the messages no search had read and brings the insert trigger back;
        applied again, it marks them all indexed. PostgreSQL: 0005 does nothing either way, and every user
        and assistant message is indexed as it is written, at 0004 as after it."""
        search_objects = self.search_objects()
        alice = make_user("alice")
        session = make_session(alice, name="Zoo")
        emu = make_run(session, "the indexed emu", None).messages.get()
        assert [hit.message_id for hit in search_sessions(alice, "emu").message_hits] == [emu.pk]
        waiting = make_run(session, "a waiting platypus", None).messages.get()
        if LAZY_INDEX:
            assert indexed_ids() == {emu.pk}
        else:
            assert indexed_ids() == {emu.pk, waiting.pk}  # the generated column, filled by the insert
        try:
            call_command("migrate", "sessions_core", "0004", verbosity=0)
            if LAZY_INDEX:
                assert message_triggers() == {"sessions_core_message_fts_ai", "sessions_core_message_fts_ad",
                                              "sessions_core_message_fts_au"}
                assert search.MESSAGE_FTS_MARK not in self.search_objects()
            else:
                assert message_triggers() == set()
                assert self.search_objects() == search_objects == {
                    "message_search_vector_idx", "session_name_trgm_idx", "search_vector"}
            assert indexed_ids() == {emu.pk, waiting.pk}
            assert_index_is_exact()
            at_0004 = make_run_at("0004", session, "a wombat while the insert trigger is back")
            assert at_0004.pk in indexed_ids()  # indexed as it was written, no search needed
            if not LAZY_INDEX:  # search works at 0004 (on SQLite it would look for 0005's mark table)
                assert [hit.message_id for hit in search_sessions(alice, "wombat").message_hits] == [at_0004.pk]
        finally:  # every app: going back unapplied the migrations that depend on these (chatapp's)
            call_command("migrate", verbosity=0)
        if LAZY_INDEX:
            assert message_triggers() == {"sessions_core_message_fts_ad", "sessions_core_message_fts_au"}
            assert indexed_upto() == at_0004.pk
        else:
            assert message_triggers() == set()
        assert self.search_objects() == search_objects
        assert_index_is_exact()
        later = make_run(session, "a later quoll", None).messages.get()
        if LAZY_INDEX:
            assert later.pk not in indexed_ids()
        else:
            assert later.pk in indexed_ids()
        for word, message in [("platypus", waiting), ("wombat", at_0004), ("quoll", later)]:
            assert [hit.message_id for hit in search_sessions(alice, word).message_hits] == [message.pk]
        assert_index_is_exact()


def models_at(migration: str):
    """The engine's models as they were at `migration` (later columns absent)."""
    from django.db.migrations.executor import MigrationExecutor

    loader = MigrationExecutor(connection).loader
    node = next(key for key in loader.graph.nodes if key[0] == "sessions_core" and key[1].startswith(migration))
    return loader.project_state(node).apps


def make_session_at(migration: str, owner, name: str):
    """make_session(owner, name=name) at `migration`; the session as the current model reads it back, lazily."""
    session = models_at(migration).get_model("sessions_core", "ChatSession").objects.create(
        owner_id=owner.pk, component_id="general", name=name)
    return ChatSession.objects.only("pk", "session_id", "last_seq").get(pk=session.pk)


def make_run_at(migration: str, session, user_text: str) -> Message:
    """make_run(session, user_text, None) with the models as they were at `migration` (later columns absent)."""
    apps = models_at(migration)
    run = apps.get_model("sessions_core", "Run").objects.create(session_id=session.pk, status="completed",
                                                                input=user_text, finished_at=timezone.now())
    session.refresh_from_db(fields=["last_seq"])
    message = apps.get_model("sessions_core", "Message").objects.create(
        session_id=session.pk, run_id=run.pk, seq=session.last_seq + 1, role="user", content=user_text)
    session.last_seq += 1
    ChatSession.objects.filter(pk=session.pk).update(last_seq=session.last_seq)
    return Message.objects.get(pk=message.pk)


# -- When messages are indexed ------------------------------------------------------------------------
# SQLite: by the search that first reads them (migration 0005). PostgreSQL: as they are written (a STORED
# generated tsvector column, `search_vector`, NULL for system and tool rows); 0005 changes nothing there.

LAZY_INDEX = connection.vendor == "sqlite"
TOKENIZE = "porter unicode61 remove_diacritics 2"  # as migration 0002 made the message index


def indexed_upto() -> int:
    """SQLite only: every message id up to this one has been looked at by the catch-up."""
    assert LAZY_INDEX
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT indexed_upto FROM {search.MESSAGE_FTS_MARK}")
        return cursor.fetchone()[0]


def message_triggers() -> set[str]:
    with connection.cursor() as cursor:
        if LAZY_INDEX:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"
                           " AND tbl_name = 'sessions_core_message'")
        else:  # the user's triggers, not the ones PostgreSQL makes for foreign keys
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = 'sessions_core_message'::regclass"
                           " AND NOT tgisinternal")
        return {row[0] for row in cursor.fetchall()}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The SQLite varint at `at`: (its value, where the next one starts)."""
    value = 0
    for i in range(at, at + 8):
        value = (value << 7) | (data[i] & 0x7F)
        if data[i] < 0x80:
            return value, i + 1
    return (value << 8) | data[at + 8], at + 9


def fts_contents(cursor, schema: str, table: str) -> tuple[int, int, list]:
    """What an FTS5 table has indexed: its count of rows and of tokens (the averages record, which bm25
    ranking reads) and every (term, rowid, position). Read after a commit: FTS5 writes the counts then."""
    cursor.execute(f"SELECT block FROM {schema}.{table}_data WHERE id = 1")
    block = (cursor.fetchone() or [b""])[0] or b"\0\0"  # (an index never written: no block, or an empty one)
    rows, at = _varint(block, 0)
    tokens = _varint(block, at)[0]
    cursor.execute(f"CREATE VIRTUAL TABLE temp.instances USING fts5vocab({schema}, {table}, instance)")
    try:
        cursor.execute("SELECT term, doc, offset FROM temp.instances ORDER BY term, doc, offset")
        return rows, tokens, cursor.fetchall()
    finally:
        cursor.execute("DROP TABLE temp.instances")


def indexed_ids() -> set[int]:
    """The messages the index has: in the FTS5 table (SQLite), or with a search_vector (PostgreSQL)."""
    with connection.cursor() as cursor:
        if not LAZY_INDEX:
            cursor.execute("SELECT id FROM sessions_core_message WHERE search_vector IS NOT NULL")
            return {row[0] for row in cursor.fetchall()}
        return {doc for _, doc, _ in fts_contents(cursor, "main", search.MESSAGE_FTS)[2]}


def assert_search_vectors_are_exact():
    """PostgreSQL: the user and assistant messages, and only they, have a search_vector, and each is the
    vector of the message's current text as the query side computes it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM sessions_core_message WHERE role IN ('user', 'assistant')")
        assert indexed_ids() == {row[0] for row in cursor.fetchall()}
        cursor.execute(
            "SELECT id FROM sessions_core_message WHERE search_vector IS DISTINCT FROM (CASE WHEN role IN"
            " ('user', 'assistant') THEN to_tsvector(%s::regconfig, translate(left(content, %s), %s, %s)) END)",
            [search.TS_CONFIG, search.INDEXED_CHARS, search.MARKUP_CHARS, search.MARKUP_STANDINS])
        assert cursor.fetchall() == []


def assert_index_is_exact():
    """The message index holds exactly what indexing the user and assistant messages up to the mark
    (all of them without a mark) from scratch gives. FTS5's integrity-check does not compare an
    external-content index with its table: it passes after a 'delete' of a row never indexed, or with
    the wrong text, or a row indexed twice. The counts and the term list catch those.
    On PostgreSQL, the generated column's equivalent (assert_search_vectors_are_exact)."""
    if not LAZY_INDEX:
        return assert_search_vectors_are_exact()
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {search.MESSAGE_FTS}({search.MESSAGE_FTS}) VALUES ('integrity-check')")
        upto = f"AND id <= (SELECT indexed_upto FROM {search.MESSAGE_FTS_MARK})"
        if search.MESSAGE_FTS_MARK not in connection.introspection.table_names(cursor):
            upto = ""
        cursor.execute(f"CREATE VIRTUAL TABLE temp.reference USING fts5(content, tokenize='{TOKENIZE}')")
        try:
            cursor.execute("INSERT INTO temp.reference(rowid, content) SELECT id, content FROM sessions_core_message"
                           f" WHERE role IN ('user', 'assistant') {upto}")
            assert fts_contents(cursor, "main", search.MESSAGE_FTS) == fts_contents(cursor, "temp", "reference")
        finally:
            cursor.execute("DROP TABLE temp.reference")


class TestMessagesAreIndexedBySearch(TransactionTestCase):
    """Every statement commits here, so the FTS5 counts on disk are current when a test reads them.
    On PostgreSQL the same scenarios check that the generated column needs no search to be current."""

    def setUp(self):
        self.alice = make_user("alice")
        self.session = make_session(self.alice, name="Notes")

    def found(self, query: str) -> list[int]:
        return [hit.message_id for hit in search_sessions(self.alice, query).message_hits]

    def test_a_run_leaves_its_messages_to_the_next_search(self):
        agent = Agent(model=OfflineModel(), instructions="Never mention the quokka.")
        agent.run("Tell me about the quokka", session_id="quokka-chat", user_id="alice")
        messages = dict(Message.objects.filter(session__session_id="quokka-chat").values_list("role", "pk"))
        assert messages.keys() == {"system", "user", "assistant"}
        if LAZY_INDEX:
            assert indexed_ids() == set()  # the run's transaction never wrote the index
            assert indexed_upto() < min(messages.values())
        else:  # no search has run: the run's own inserts filled the column
            assert indexed_ids() == {messages["user"], messages["assistant"]}
        found = self.found("quokka")
        assert messages["user"] in found and messages["system"] not in found
        if LAZY_INDEX:
            assert indexed_upto() == max(messages.values())
        assert indexed_ids() == {messages["user"], messages["assistant"]}
        assert_index_is_exact()

    def test_edits_and_deletes_keep_the_index_exact_whether_a_search_indexed_the_message_or_not(self):
        indexed = make_run(self.session, "apricot jam", "boil the apricots")
        assert len(self.found("apricot")) == 2
        waiting = make_run(self.session, "damson gin", "sloe gin")
        if LAZY_INDEX:
            assert indexed_upto() < min(waiting.messages.values_list("pk", flat=True))
        else:
            assert set(waiting.messages.values_list("pk", flat=True)) <= indexed_ids()
        for run, text in [(indexed, "quince paste"), (waiting, "medlar jelly")]:
            run.messages.filter(role="user").update(content=text)
            run.messages.filter(role="assistant").delete()
        assert_index_is_exact()  # before any search: the triggers alone (PostgreSQL: the generated column)
        assert self.found("apricot") == [] and self.found("damson") == [] and self.found("gin") == []
        assert self.found("quince") == [indexed.messages.get().pk]
        assert self.found("medlar") == [waiting.messages.get().pk]
        assert_index_is_exact()

    def test_system_and_tool_messages_are_never_indexed(self):
        system = add_message(self.session, "system", "You are zanzibar, a helpful assistant.")
        user = make_run(self.session, "where is zanzibar", None).messages.get()
        tool = add_message(self.session, "tool", "zanzibar added")
        if not LAZY_INDEX:
            assert indexed_ids() == {user.pk}  # system and tool rows have a NULL search_vector
        assert self.found("zanzibar") == [user.pk]
        if LAZY_INDEX:
            assert indexed_upto() == tool.pk  # looked at, and skipped
        Message.objects.filter(pk=system.pk).update(content="You are zanzibar, still.")
        assert indexed_ids() == {user.pk}
        assert_index_is_exact()

    def test_of_two_searches_that_saw_the_same_new_messages_the_second_indexes_nothing(self):
        message = make_run(self.session, "a lone narwhal", None).messages.get()

        def the_other_search_first(using):
            """Between this search's check and its catch-up, another search indexes everything."""
            with mock.patch.object(fts5, "transaction", transaction):
                fts5.index_new_messages(using)
            return transaction.atomic(using=using)

        if LAZY_INDEX:
            with mock.patch.object(fts5, "transaction", mock.Mock(atomic=the_other_search_first)):
                assert self.found("narwhal") == [message.pk]
        else:  # there is no catch-up to race: searches only read the column the insert filled
            with mock.patch.object(fts5, "index_new_messages", side_effect=AssertionError("no catch-up")):
                assert self.found("narwhal") == [message.pk]
                assert self.found("narwhal") == [message.pk]
        assert_index_is_exact()  # indexed once

    def test_after_a_flush_the_ids_start_again_and_are_still_indexed(self):
        for word in ["alpha", "beta", "gamma"]:
            make_run(self.session, f"{word} words", f"{word} reply")
        assert len(self.found("alpha")) == 2
        if LAZY_INDEX:
            assert indexed_upto() >= 6
        call_command("flush", interactive=False, verbosity=0)  # resets the id sequences too
        if LAZY_INDEX:
            assert indexed_upto() == 0
        assert indexed_ids() == set()
        alice = make_user("alice")
        message = make_run(make_session(alice, name="Again"), "a fresh marmot", None).messages.get()
        assert message.pk == 1
        assert [hit.message_id for hit in search_sessions(alice, "marmot").message_hits] == [1]
        assert_index_is_exact()
