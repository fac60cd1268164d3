"""The documentation's public names, read from the documentation itself (README.md, the landing
page, and the manual in docs/*.md): what the contract test holds the plugin to (so a name
documented without a test, or tested without being documented, fails)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """README.md first (its first code block is what a new user types), then docs/*.md by name."""
    return [README, *sorted(DOCS.glob("*.md"))]


def text() -> str:
    """Every page, README.md first: the names documented anywhere."""
    return "\n\n".join(page.read_text(encoding="utf-8") for page in pages())


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def section(title: str) -> str:
    """The section under ``## title`` (to the next ``## `` heading), or a docs page's opening under its
    ``# title`` (to its first ``## ``), in whichever page holds it: README.md's if it has one (a docs
    page may reuse a heading such as "Running"), else the one docs page that does."""
    found = []
    for page in pages():
        body = "\n" + page.read_text(encoding="utf-8")
        starts = [body.find(f"\n## {title}\n")] + ([0] if body.startswith(f"\n# {title}\n") else [])
        for start in (s for s in starts if s >= 0):
            end = body.find("\n## ", start + 1)
            found.append((page, body[start: end if end > 0 else None]))
    if found and found[0][0] == README:
        return found[0][1]
    assert len(found) == 1, f"section {title!r}: expected in README.md or one docs page, found in {[p.name for p, _ in found]}"
    return found[0][1]


def code_blocks(body: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", body, re.S)


def options_table() -> list[tuple[str, str, str]]:
    """(option, ini, env) of each row of the options table."""
    rows = re.findall(r"^\| `(--ftready[\w-]*)[^|]*\| *(?:`(\w+)`)? *\| *(?:`(\w+)`)? *\|", text(), re.M)
    return [(option, ini, env) for option, ini, env in rows]


def check_rows() -> list[tuple[str, str]]:
    """(check id, marker column) of each row of the checks table; a row naming two ids gives two."""
    rows = []
    for ids, markers in re.findall(r"^\| (`[a-z]+\.[\w.\[\]]+`(?: / `[a-z]+\.\w+`)?) \|([^|]*)\|",
                                   section("The checks"), re.M):
        for check_id in re.findall(r"`([^`]+)`", ids):
            rows.append((check_id.split("[")[0], markers.strip()))
    return rows


def documented() -> dict[str, set[str]]:
    """Every public name the README documents, by kind."""
    body = text()
    table = options_table()
    running = code_blocks(section("Running"), "bash")[0]
    return {
        "option": set(re.findall(r"`(--ftready[\w-]*)", body)),
        "ini": {ini for _, ini, _ in table if ini},
        "env": set(re.findall(r"\b(FTREADY_[A-Z_]+|GITHUB_STEP_SUMMARY)\b", body)),
        "fixture": set(re.findall(r"^\| `(ftready_\w+)` \| (?:session|function) \|", body, re.M)),
        "marker": set(re.findall(r"@pytest\.mark\.(\w+)", body))
                  | set(re.findall(r"`(ftready(?:_[a-z]+)?|accelerator|nightly)`", section("Markers"))),
        "hook": set(re.findall(r"\b(pytest_ftready_\w+)\(", body)),
        "command": set(re.findall(r"(?<![\w-])(ftready-[a-z]+)\b", body)),
        "artifact": set(re.findall(r"`([\w.*-]+\.(?:json|html))`", section("Measurements and artifacts")))
                    | set(re.findall(r"`(\.run-[^`]*\*)`", body)),
        "exit code": {f"{re.findall(r'ftready-[a-z]+', body[:m.start()])[-1]}: exit {m.group(1)}"
                      for m in re.finditer(r"\(exit (\d[^)]*)\)", body)},
        "running": {line.split("  #")[0].strip() for line in running.splitlines() if line.strip()},
        "check": {check_id for check_id, _ in check_rows()},
        "code block": {block_key(block) for lang, block in re.findall(r"```(\w+)\n(.*?)```", body, re.S)},
    }


def block_key(block: str) -> str:
    """A code block by its first line, without its comment: how the contract names it."""
    return block.splitlines()[0].split("  #")[0].strip()
