"""Question normalisation for the normalised-exact level (and the semantic guard).

Only changes that cannot change what is asked: Unicode form, case, whitespace,
punctuation, contractions, articles and politeness/filler phrases. Numbers,
units, currency and percent signs, negations and every content word are kept.
"""

from __future__ import annotations

import re
import unicodedata

_CONTRACTIONS = [
    (r"\bwon't\b", "will not"), (r"\bcan't\b", "can not"), (r"\bcannot\b", "can not"),
    (r"\bshan't\b", "shall not"), (r"\bain't\b", "is not"), (r"\blet's\b", "let us"),
    (r"n't\b", " not"), (r"'re\b", " are"), (r"'ve\b", " have"), (r"'ll\b", " will"),
    (r"'d\b", " would"), (r"'m\b", " am"),
    (r"\b(it|that|what|where|who|how|when|why|there|here|he|she|this|which)'s\b", r"\1 is"),
    (r"'s\b", ""),  # remaining 's is a possessive: "the dog's color" ~ "the dog color"
]
_CONTRACTIONS_RE = [(re.compile(p), r) for p, r in _CONTRACTIONS]

# Whole phrases that carry no question content (matched on word boundaries).
_FILLER_PHRASES = [
    "i would like to know", "i'd like to know", "i want to know", "i wonder", "do you know",
    "let me know", "can you please", "could you please", "would you please", "can you", "could you",
    "would you", "will you", "tell me", "please", "kindly", "thank you", "thanks", "hey there", "hey",
    "hi there", "hi", "hello", "okay so", "ok so", "so,", "quick question",
]
_FILLER_RE = re.compile(r"\b(?:" + "|".join(re.escape(p) for p in sorted(_FILLER_PHRASES, key=len, reverse=True))
                        + r")\b")
_ARTICLES = frozenset({"a", "an", "the"})
# Digits keep their separators (1,000 -> 1000; 3.5 stays); $ € £ % are meaningful.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_TOKEN = re.compile(r"\d+(?:st|nd|rd|th)\b|\d+(?:\.\d+)?|[^\W_]+|[$€£¥%]")


def normalize_question(text: str) -> str:
    t = unicodedata.normalize("NFKC", text).lower()
    t = t.replace("\u2019", "'").replace("\u2018", "'").replace("`", "'")
    for rx, rep in _CONTRACTIONS_RE:
        t = rx.sub(rep, t)
    t = _FILLER_RE.sub(" ", t)
    t = _THOUSANDS.sub("", t)
    return " ".join(w for w in _TOKEN.findall(t) if w not in _ARTICLES)
