"""The README's public names, read from the README itself: what the contract test holds the
plugin to (so a name documented without a test, or tested without being documented, fails)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def text() -> str:
    return README.read_text(encoding="utf-8")


def section(title: str) -> str:
    """The README section under ``## title`` (to the next ``## `` heading)."""
    body = text()
    start = body.index(f"\n## {title}\n")
    end = body.find("\n## ", start + 1)
    return body[start: end if end > 0 else None]


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
