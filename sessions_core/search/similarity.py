"""How close a title is to the query's words, for typo matches: trigram word similarity or edit distance.

PostgreSQL computes the trigram figure itself (pg_trgm's `word_similarity`, which also picks the
candidates through the name's GIN index). SQLite has no pg_trgm, so `word_similarity` here is its
definition in Python (a PostgreSQL test checks it gives pg_trgm's figures); it also decides which words of
a title are marked as the typo's target, on both databases. Trigrams alone rate a swap of two letters
low ("panckaes" shares under half of the trigrams of "pancakes"), so a word within an edit or two of a
title word counts as well: `title_similarity` is the better of the two.
"""

from __future__ import annotations

from .query import WORD

TITLE_SIMILARITY = 0.5  # a title at least this close to the query is a typo match


def title_similarity(words: list[str], name: str, trigram: float | None = None) -> float:
    """How close a title is to the query's words, 0 to 1: the trigram word similarity (`trigram` when the
    database computed it, else `word_similarity`), or, where every word of four letters or more is a
    typo of a word of the title (a letter wrong, missing, extra, or two swapped: one such edit per word of
    up to seven letters, two in a longer one), the share of letters typed right."""
    if trigram is None:
        trigram = word_similarity(" ".join(words), name)
    title_words = WORD.findall(name.lower())
    edits, letters = 0, 0
    for word in words:
        if len(word) < 4 or not title_words:
            return trigram
        allowed = 1 if len(word) <= 7 else 2
        distance = min(edit_distance(word, other, allowed) for other in title_words)
        if distance > allowed:
            return trigram
        edits, letters = edits + distance, letters + len(word)
    return max(trigram, 1 - edits / letters) if letters else trigram


def edit_distance(a: str, b: str, bound: int) -> int:
    """Damerau-Levenshtein distance (optimal string alignment) between a and b, or bound + 1 once over it."""
    if abs(len(a) - len(b)) > bound:
        return bound + 1
    before, row = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > bound:
            return bound + 1
        before, row = row, current
    return row[-1]


def _trigram_sequence(text: str) -> list[str]:
    """pg_trgm's trigrams in text order: lower-cased words, each padded with two spaces before, one after."""
    grams = []
    for word in WORD.findall(text.lower()):
        padded = f"  {word} "
        grams += [padded[i:i + 3] for i in range(len(padded) - 2)]
    return grams


def word_similarity(query: str, name: str) -> float:
    """pg_trgm's word_similarity(query, name): the best match between the query's trigrams and any
    stretch of the name's, where trigrams of the stretch missing from the query count against it."""
    wanted = set(_trigram_sequence(query))
    sequence = _trigram_sequence(name)
    best = 0.0
    # A best stretch starts and ends on a shared trigram, so only those starting points are tried.
    for start in (i for i, gram in enumerate(sequence) if gram in wanted):
        shared, extra = set(), set()
        for gram in sequence[start:]:
            (shared if gram in wanted else extra).add(gram)
            if gram in wanted:
                best = max(best, len(shared) / (len(wanted) + len(extra)))
    return best
