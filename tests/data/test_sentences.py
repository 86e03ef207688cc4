"""The rule-based sentence splitter."""

import pytest

from bertjax.data.sentences import split_sentences


@pytest.mark.parametrize("text,expected", [
    ("One sentence. Another one! A third? Yes.",
     ["One sentence.", "Another one!", "A third?", "Yes."]),
    ("Dr. Smith met Mr. Jones at 3.30 p.m. on Monday. They talked.",
     ["Dr. Smith met Mr. Jones at 3.30 p.m. on Monday.", "They talked."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("J. R. R. Tolkien wrote books. Version 2.0 is out.",
     ["J. R. R. Tolkien wrote books.", "Version 2.0 is out."]),
    ("Line one\nLine two. Still two", ["Line one", "Line two.", "Still two"]),
    ("lower case after a period. keeps going", ["lower case after a period. keeps going"]),
    ("   \n\n  ", []),
])
def test_split_sentences(text, expected):
  assert split_sentences(text) == expected
