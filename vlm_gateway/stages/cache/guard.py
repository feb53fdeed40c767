"""Near-miss guard for semantic candidates.

Sentence embeddings score "left vs right", "total vs tax", "2022 vs 2023" or a
yes/no reversal at 0.94-0.97 cosine, so similarity alone cannot tell a
paraphrase from a different question. The guard reduces both questions to their
content words (question framing, function words and politeness dropped;
synonyms, number words, plurals and spelling variants folded) and accepts a
candidate only when those agree. The differing words are reported by kind
(number, year, negation, direction, entity, content) for diagnostics. When the
question has words whose order carries meaning (directions, comparisons,
numbers and ordinals), the order must agree too: "dog left of cat" is not "cat
left of dog".
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from .normalize import normalize_question

# Words that frame a question about an image without changing what is asked.
_FRAMING = frozenset("""
is are was were be been being am do does did can could would will shall should may might must
this that these those it its there here of in on at to for with by about as and or
image picture photo photograph pic screenshot img
tell show shown showing see seen visible displayed display say says saying said written write read
give find me you your i we us my our let know like want
exactly currently actually please look looks seem seems appear appears all
""".split())
# Negations are content; listed to report the kind of difference.
_NEGATIONS = frozenset({"not", "no", "never", "none", "nothing", "nobody", "neither", "nor", "without"})
_DIRECTIONS = frozenset("""
left right above below over under top bottom front behind back before after up down north south east west
inside outside between beside next near far first last middle upper lower leftmost rightmost
more less fewer greater larger bigger smaller higher lower than most least max maximum min minimum
from earlier later previous next
""".split())
_SYNONYMS = {
    "colour": "color", "colours": "color", "colors": "color", "grey": "gray", "centre": "center",
    "which": "what", "whats": "what", "amount": "", "value": "", "figure": "",
    "automobile": "car", "photos": "", "pictures": "", "images": "",
    "largest": "biggest", "summary": "summarize", "summarise": "summarize", "extract": "transcribe",
}
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}
_ORDINALS = {w: f"{i + 1}th" for i, w in enumerate(
    "first second third fourth fifth sixth seventh eighth ninth tenth".split())}
_ORDINAL_DIGITS = re.compile(r"^(\d+)(st|nd|rd|th)$")
_PHRASES = [
    (re.compile(r"\b(?:from|in|on|of) (?:this |that )?(?:image|picture|photo|photograph|screenshot|pic)\b"), ""),
    (re.compile(r"\bwhat is number of\b"), "how many"),
    (re.compile(r"\bnumber of\b"), "how many"), (re.compile(r"\bcount\b"), "how many"),
    (re.compile(r"\bwhat is in\b"), "describe"), (re.compile(r"\bwhat do you see\b"), "describe"),
    (re.compile(r"\bwhat is going on in\b"), "describe"), (re.compile(r"\bwhat is happening in\b"), "describe"),
    (re.compile(r"\bdescription of\b"), "describe"),
    (re.compile(r"\bhow much\b"), "what"),
]
_WH = frozenset({"what", "who", "whom", "whose", "where", "when", "why", "how"})
# A question that opens with one of these is a yes/no question.
_AUXILIARIES = frozenset("is are was were do does did can could will would should has have had shall may".split())
_YEAR = re.compile(r"^(1[5-9]|2[0-9])\d\d$")


def _fold(word: str) -> str:
    if word in _NUMBER_WORDS:
        return _NUMBER_WORDS[word]
    if word in _ORDINALS:
        return _ORDINALS[word]
    m = _ORDINAL_DIGITS.match(word)
    if m:
        return m.group(1) + "th"
    if word in _SYNONYMS:
        return _SYNONYMS[word]
    if len(word) > 4 and not word.isdigit():
        if word.endswith("ies"):
            return word[:-3] + "y"
        if word.endswith(("ches", "shes", "xes", "sses")):
            return word[:-2]
        if word.endswith("s") and not word.endswith(("ss", "us", "is")):
            return word[:-1]
    elif len(word) == 4 and word.endswith("s") and word[-2] not in "su" and word.isalpha():
        return word[:-1]  # cats -> cat, dogs -> dog
    return word


@dataclass(frozen=True, slots=True)
class Content:
    words: tuple[str, ...]
    entities: frozenset[str]
    # "what ..." and an imperative/noun phrase ("the date on the invoice", "tell me
    # the date ...") ask the same; a yes/no question ("is it ...") does not.
    yes_no: bool = False

    @property
    def ordered(self) -> bool:
        return any(w in _DIRECTIONS or w[0].isdigit() for w in self.words)


def content_words(question: str, original: str = "") -> Content:
    """``question`` is normalised text; ``original`` (as sent) reveals named entities."""
    t = normalize_question(question)
    first = t.split(" ", 1)[0] if t else ""
    for rx, rep in _PHRASES:
        t = rx.sub(rep, t)
    words = []
    for w in t.split():
        if w in _FRAMING:
            continue
        f = _fold(w)
        if f and f not in _FRAMING:
            words.append(f)
    ents = frozenset(w.lower() for w in re.findall(r"(?<![.?!]\s)(?<!^)\b[A-Z][a-z]+\b", original or ""))
    return Content(tuple(words), ents, first in _AUXILIARIES)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str  # "" when ok; else number|year|negation|direction|entity|content|order
    differing: tuple[str, ...] = ()


def _kind(word: str, ents: frozenset[str]) -> str:
    if _YEAR.match(word):
        return "year"
    if word[0].isdigit() or word in _ORDINALS.values():
        return "number"
    if word in _NEGATIONS:
        return "negation"
    if word in _DIRECTIONS:
        return "direction"
    if word in ents:
        return "entity"
    return "content"


def _implicit_what(c: Content) -> Content:
    if c.yes_no or any(w in _WH for w in c.words):
        return c
    return Content(("what",) + c.words, c.entities, c.yes_no)


def check(query: Content, candidate: Content) -> Verdict:
    if query.yes_no != candidate.yes_no:
        return Verdict(False, "content", ())
    query, candidate = _implicit_what(query), _implicit_what(candidate)
    a, b = Counter(query.words), Counter(candidate.words)
    if a != b:
        diff = tuple(sorted(((a - b) + (b - a)).keys()))
        ents = query.entities | candidate.entities
        kinds = [_kind(w, ents) for w in diff]
        order = ("year", "negation", "number", "direction", "entity", "content")
        return Verdict(False, min(kinds, key=order.index), diff)
    if (query.ordered or candidate.ordered) and query.words != candidate.words:
        return Verdict(False, "order", ())
    if not query.words:
        return Verdict(False, "content", ())  # nothing left to compare: never a semantic hit
    return Verdict(True, "")
