"""Every relative link in the README and the docs reaches a file that is
there, and a `#section` of it a heading that is there (GitHub's anchors)."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "launch/README.md", *sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path):
  """GitHub's anchor of each heading: lower case, punctuation but '-' and '_'
  dropped, spaces as '-'."""
  text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
  headings = re.findall(r"^#+\s+(.+?)\s*$", text, re.M)
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_reach_their_file_and_section():
  broken = []
  for doc in DOCS:
    text = re.sub(r"```.*?```", "", open(os.path.join(ROOT, doc), encoding="utf-8").read(),
                  flags=re.S)
    for target in LINK.findall(text):
      if re.match(r"[a-z]+:", target):
        continue  # https:, mailto:
      path, _, anchor = target.partition("#")
      full = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else \
          os.path.join(ROOT, doc)
      if not os.path.exists(full):
        broken.append(f"{doc}: {target} (no such file)")
      elif anchor and full.endswith(".md") and anchor not in _anchors(full):
        broken.append(f"{doc}: {target} (no such section)")
  assert not broken, "\n".join(broken)
