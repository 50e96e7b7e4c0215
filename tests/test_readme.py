"""The READMEs stay true to the code: links resolve, the option table and the
environment variables match what the installed command accepts."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, ZMQPUSH

READMES = ("README.md", "bench/README.md", "tests/README.md")
NO_ENVIRONMENT_TWIN = {"--help", "--help-all", "--version", "--make-cert"}


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation
    other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def prose(markdown: str) -> str:
    """The text outside fenced code blocks, with inline code spans emptied."""
    outside = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", outside)


def anchors(path: Path) -> set:
    """Every anchor a Markdown file defines: headings (GitHub's numbering of
    repeated slugs included) and explicit <a id="...">."""
    text = prose(path.read_text())
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        found.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    found.update(re.findall(r'<a\s+id="([^"]+)"', text))
    return found


def links(path: Path) -> list:
    """Every link target in a Markdown file's prose, except web and mail addresses."""
    targets = re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text()))
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def broken_links(readme: str) -> list:
    """Links in readme whose file does not exist or whose #anchor no heading defines."""
    source = ROOT / readme
    broken = []
    for target in links(source):
        file_part, _, anchor = target.partition("#")
        dest = (source.parent / file_part).resolve() if file_part else source
        if not dest.exists():
            broken.append(target)
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(target)
    return broken


@pytest.mark.parametrize("readme", READMES)
def test_every_link_resolves(readme):
    assert (ROOT / readme).exists()
    assert broken_links(readme) == []


def test_slugs_follow_github():
    assert github_slug("Connecting: zmqpush is the CURVE client") == \
        "connecting-zmqpush-is-the-curve-client"
    assert github_slug("The original's Stats table") == "the-originals-stats-table"
    assert github_slug("Where the time goes, and what was tried") == \
        "where-the-time-goes-and-what-was-tried"


def help_options() -> set:
    """Long options that the installed command's --help-all lists."""
    result = subprocess.run([sys.executable, ZMQPUSH, "--help-all"], capture_output=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    options = set()
    for line in result.stdout.decode().splitlines():
        if re.match(r"\s{2}-", line):
            names = re.split(r"\s{2,}", line.strip())[0]
            options.update(re.findall(r"--[a-z][a-z0-9-]*", names))
    assert "--connect" in options and "--spool-sync" in options
    return options


def option_table() -> list:
    """(options, variables) named in each row of README.md's option table: the long
    options of its first column and the ZMQPUSH_* names of its second."""
    text = (ROOT / "README.md").read_text()
    table = text.split("| option | variable |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for row in table.splitlines()[2:]:
        cells = row.split(" | ")
        rows.append((re.findall(r"--[a-z][a-z0-9-]*", cells[0]),
                     re.findall(r"ZMQPUSH_[A-Z0-9_]+", cells[1])))
    return rows


def twin(option: str) -> str:
    """The environment variable that stands for a long option."""
    return "ZMQPUSH_" + option[2:].upper().replace("-", "_")


def test_option_table_matches_help():
    assert {o for options, _ in option_table() for o in options} == help_options()


def test_option_table_names_each_option_variable():
    for options, variables in option_table():
        expected = list(dict.fromkeys(twin(o) for o in options
                                      if o not in NO_ENVIRONMENT_TWIN))
        assert variables == expected, options


def environment_variables() -> set:
    """ZMQPUSH_* variables: the twin of every option but the actions, LOGTYPE's,
    and any the source names literally."""
    derived = {twin(option) for option in help_options() - NO_ENVIRONMENT_TWIN}
    literal = set(re.findall(r"ZMQPUSH_[A-Z][A-Z0-9_]*[A-Z0-9]",
                             (ROOT / "zmqpush.py").read_text()))
    return derived | literal | {"ZMQPUSH_LOGTYPE"}


def test_readme_names_every_environment_variable():
    named = set(re.findall(r"ZMQPUSH_[A-Z][A-Z0-9_]*[A-Z0-9]",
                           (ROOT / "README.md").read_text()))
    real = environment_variables()
    assert real - named == set(), "variables the README does not name"
    assert named - real == set(), "variables the README names that do not exist"


def section_references() -> list:
    """(file, section) for every 'README "…"' heading the code, tests and benchmarks cite."""
    sources = [ROOT / "zmqpush.py", ROOT / "zmqpush-watermark.py", ROOT / "setup.py",
               *sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    return [(source.name, section) for source in sources
            for section in re.findall(r'README \\?"([A-Z][^"\\]*)\\?"', source.read_text())]


def test_cited_readme_sections_exist():
    headings = anchors(ROOT / "README.md")
    cited = section_references()
    assert ("zmqpush.py", "Flow control and memory") in cited
    assert [(f, s) for f, s in cited if github_slug(s) not in headings] == []
