"""A rule-based English sentence splitter for one-document-per-line corpora.

The paper's corpora come one sentence per line; text that arrives as whole
documents (TFDS `wikipedia`, one document per line) is split here: after `.`,
`!` or `?` (and any closing quotes or brackets) followed by whitespace and a
capital letter, digit or opening quote, unless the word before the period is a
known abbreviation or a single initial. Newlines always end a sentence.
"""

from __future__ import annotations

import re

_ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al approx dept est fig figs
inc ltd co corp no nos vol vols pp ed eds jan feb mar apr jun jul aug sep sept oct
nov dec gen col lt sgt capt cmdr gov sen rep rev hon u.s u.k a.m p.m ph.d
""".split())

# A candidate boundary: terminal punctuation, optional closers, whitespace, then
# something that can start a sentence.
_BOUNDARY = re.compile(r"""([.!?]+["'”’)\]]*)\s+(?=["'“‘(\[]?[A-Z0-9])""")
_LAST_WORD = re.compile(r"(\S+)$")


def _is_abbreviation(text_before: str) -> bool:
  match = _LAST_WORD.search(text_before)
  if not match:
    return False
  word = match.group(1).lstrip("\"'“‘([").rstrip(".").lower()
  # Single letters are initials ("J. R. R. Tolkien").
  return word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def split_sentences(text: str) -> list[str]:
  """Splits text into sentences; blank results are dropped."""
  sentences = []
  for paragraph in text.splitlines():
    start = 0
    for match in _BOUNDARY.finditer(paragraph):
      end = match.end(1)
      if match.group(1).startswith(".") and len(match.group(1).rstrip("\"'”’)]")) == 1 \
          and _is_abbreviation(paragraph[start:match.start(1) + 1]):
        continue
      sentence = paragraph[start:end].strip()
      if sentence:
        sentences.append(sentence)
      start = match.end()
    tail = paragraph[start:].strip()
    if tail:
      sentences.append(tail)
  return sentences
