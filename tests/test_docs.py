"""The project documents itself: checks on docs/architecture.md and on what points at it.

- No tracked file refers to a document outside the repository, by its file name or
  by its section marks (``FORBIDDEN``), nor to the notes the project grew from by their
  name (``FORBIDDEN_NAMES``, found across line breaks too): the code says the fact
  itself, cites its public source, or refers to docs/architecture.md. The forbidden
  strings are assembled from pieces, so this file never holds them.
- Every ``docs/architecture.md#<anchor>`` written anywhere in a tracked file (and
  every ``, #<anchor>`` that continues such a reference on the same line) names a
  heading of docs/architecture.md, with anchors made the way GitHub makes them.
  Links inside the document (``](#anchor)``) are checked the same way.

Files come from ``git ls-files``; only binary files (a NUL byte) are left out.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = "docs/architecture.md"

_OUTSIDE = "DESIGN"
FORBIDDEN = (
    re.compile(re.escape(_OUTSIDE) + r"\s*" + re.escape("\u00a7")),  # its section marks
    re.compile(r"\b" + re.escape(_OUTSIDE + "." + "md") + r"\b"),  # its file name
)
_NOTES = ("fie" + "ld", "gu" + "ide")
FORBIDDEN_NAMES = (
    # the notes' name, in any case, spaced, hyphenated or joined by "_", across lines
    re.compile(r"(?<![A-Za-z])" + _NOTES[0] + r"[\s_-]*" + _NOTES[1], re.IGNORECASE),
)

# ``docs/architecture.md#<anchor>``; built from pieces, so this file holds no reference.
_REFERENCE = re.compile(re.escape(DOC) + "#" + r"([A-Za-z0-9_%.\-]+)")
# ``…#first, #second`` or ``…#first, layer 4; #second``: more anchors on the same line,
# up to a closing parenthesis or the next reference (an anchor starts with a letter,
# so ``#123`` issue numbers are not taken for one).
_CONTINUATION = re.compile(r"[,;][^,;)#\n]*?#([A-Za-z][A-Za-z0-9_\-]*)")
_IN_DOC_LINK = re.compile(r"\]\(#([^)\s]+)\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def tracked_files(root: Path = ROOT) -> list[Path]:
    """Every file ``git ls-files`` lists under ``root`` that exists in the work tree."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    done = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"{root} is not a git work tree: {done.stderr.decode(errors='replace')}")
    names = [n for n in done.stdout.decode("utf-8", errors="replace").split("\0") if n]
    return [root / n for n in names if (root / n).is_file()]


def text_files(root: Path = ROOT) -> Iterator[tuple[str, str]]:
    """``(relative path, text)`` of every tracked file that is not binary."""
    for path in tracked_files(root):
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        yield path.relative_to(root).as_posix(), data.decode("utf-8", errors="replace")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: inline markup removed, lowercased, every
    character that is not a letter, digit, space, ``-`` or ``_`` dropped, spaces
    turned into ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def heading_anchors(markdown: str) -> set[str]:
    """Every anchor the headings of ``markdown`` produce (repeated headings get ``-1``,
    ``-2`` … as on GitHub); lines inside fenced code blocks are not headings."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fence: str | None = None
    for line in markdown.splitlines():
        opened = _FENCE.match(line)
        if opened:
            if fence is None:
                fence = opened.group(1)
            elif opened.group(1) == fence:
                fence = None
            continue
        if fence is not None:
            continue
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def anchor_references(text: str) -> list[str]:
    """The anchors ``text`` points at in docs/architecture.md, in order of appearance."""
    found: list[str] = []
    for match in _REFERENCE.finditer(text):
        found.append(match.group(1).rstrip("."))
        line_end = text.find("\n", match.end())
        rest = text[match.end() : len(text) if line_end < 0 else line_end]
        rest = rest.split(")", 1)[0].split(DOC + "#", 1)[0]
        found.extend(m.group(1) for m in _CONTINUATION.finditer(rest))
    return found


# -- the helpers themselves ---------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Layers and packages", "layers-and-packages"),
        ("Env fix and Hugging Face diagnosis", "env-fix-and-hugging-face-diagnosis"),
        ("The `pty` framing!", "the-pty-framing"),
        ("Pod-side scripts", "pod-side-scripts"),
        ("Costs: USD/h × seconds", "costs-usdh--seconds"),
        ("[Link](http://x) text_with_underscores", "link-text_with_underscores"),
    ],
)
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_heading_anchors_skip_code_and_number_repeats() -> None:
    markdown = "# Title\n## Same\n```\n# not a heading\n```\n## Same\n#nospace\n"
    assert heading_anchors(markdown) == {"title", "same", "same-1"}


def test_anchor_references_read_continuations() -> None:
    ref = DOC + "#"
    text = (
        f"see {ref}first, #second and ({ref}third, layer 4; #fourth) but not #fifth\n"
        f"{ref}sixth.\n"
        f"{ref}seventh, see issue #123\n"
    )
    assert anchor_references(text) == [
        "first",
        "second",
        "third",
        "fourth",
        "sixth",
        "seventh",
    ]


def test_forbidden_patterns_match_what_they_should() -> None:
    file_name = _OUTSIDE + "." + "md"
    mark = _OUTSIDE + " \u00a7"
    for text in (f"see {file_name}", f"as in {mark}4", f"({_OUTSIDE}\u00a72)"):
        assert any(p.search(text) for p in FORBIDDEN), text
    assert not any(p.search("the design of the console") for p in FORBIDDEN)
    name = " ".join(_NOTES)
    for text in (
        f"as the {name} advises",
        f"The {name.title()}'s rule",
        f"test_{name.replace(' ', '_')}_fix",
        f"{name.replace(' ', '-')}: 2.1 image",
        f"the {_NOTES[0]}\n    {_NOTES[1]}'s report",
    ):
        assert any(p.search(text) for p in FORBIDDEN_NAMES), text
    assert not any(p.search(f"a {_NOTES[0]}, then a {_NOTES[1]}") for p in FORBIDDEN_NAMES)


# -- the repository -----------------------------------------------------------------


def test_no_file_cites_an_outside_document() -> None:
    hits = []
    for name, text in text_files():
        for number, line in enumerate(text.splitlines(), start=1):
            if any(p.search(line) for p in FORBIDDEN):
                hits.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not hits, (
        "these lines cite a document outside the repository; point at "
        f"{DOC}#<section> (the project's own words) instead:\n" + "\n".join(hits)
    )


def test_no_file_names_the_notes_the_project_grew_from() -> None:
    hits = []
    for name, text in text_files():
        for pattern in FORBIDDEN_NAMES:
            for match in pattern.finditer(text):
                number = text.count("\n", 0, match.start()) + 1
                line = text.splitlines()[number - 1].strip()[:120]
                hits.append(f"{name}:{number}: {line}")
    assert not hits, (
        "these lines cite notes the repository does not have; say the fact itself or cite "
        "its public source (RunPod's docs, huggingface_hub, …):\n" + "\n".join(hits)
    )


def test_every_architecture_anchor_resolves() -> None:
    doc = ROOT / DOC
    assert doc.is_file(), f"{DOC} is missing"
    markdown = doc.read_text(encoding="utf-8")
    anchors = heading_anchors(markdown)
    broken = []
    references = 0
    for name, text in text_files():
        for anchor in anchor_references(text):
            references += 1
            if anchor not in anchors:
                broken.append(f"{name}: #{anchor}")
    for anchor in _IN_DOC_LINK.findall(markdown):
        references += 1
        if anchor not in anchors:
            broken.append(f"{DOC} (link inside the document): #{anchor}")
    assert references > 0, f"nothing points at {DOC}: the search itself is broken"
    assert not broken, (
        f"these anchors name no heading of {DOC} (headings: {sorted(anchors)}):\n"
        + "\n".join(broken)
    )
