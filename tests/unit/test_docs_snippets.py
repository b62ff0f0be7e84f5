"""The docs include real example files with pymdownx.snippets; a mangled include marker renders
as literal text instead of the file (mkdocs --strict does not notice), so each is checked here."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"$')


def include_lines():
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("--8"):
                yield page.relative_to(ROOT), number, line.strip()


def test_there_are_includes_to_check():
    assert any(True for _ in include_lines())


def test_every_include_is_well_formed_and_names_an_existing_file():
    bad = []
    for page, number, line in include_lines():
        match = MARKER.match(line)
        if match is None or not (ROOT / match["path"]).is_file():
            bad.append(f"{page}:{number}: {line}")
            continue
        if match["section"]:
            text = (ROOT / match["path"]).read_text()
            if f"--8<-- [start:{match['section']}]" not in text:
                bad.append(f"{page}:{number}: no section {match['section']!r}")
    assert not bad, "\n".join(bad)
