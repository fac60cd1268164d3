"""Secrets and personal data in text: one pass of one compiled pattern, then validators
(Luhn for cards, mod 97 for IBANs, checksums for national ids, entropy for assigned
secrets). Findings carry a fingerprint and a redacted preview, never the value."""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

SECRET_KINDS = frozenset({
    "private_key", "aws_access_key_id", "aws_secret_access_key", "gcp_api_key", "azure_storage_key", "github_token",
    "gitlab_token", "slack_token", "slack_webhook", "huggingface_token", "openai_key", "anthropic_key",
    "stripe_key", "jwt", "assigned_secret",
})
PII_KINDS = frozenset({"email", "phone", "payment_card", "iban", "ip_address", "national_id"})

# Order matters: at one position the first alternative that matches wins.
_PATTERNS = [
    # The whole block: header, body (real or JSON-escaped newlines) and END line; a block cut
    # short (truncation) still takes every body character that follows its header.
    ("private_key", r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |PGP |ENCRYPTED )?PRIVATE KEY(?: BLOCK)?-----"
                    r"(?:(?!-----)[A-Za-z0-9+/=\s:,.-]|\\[nr])*"
                    r"(?:-----END (?:RSA |EC |DSA |OPENSSH |PGP |ENCRYPTED )?PRIVATE KEY(?: BLOCK)?-----)?"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("aws_access_key_id", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b"),
    ("gcp_api_key", r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),
    ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})\b"),
    ("gitlab_token", r"\bglpat-[A-Za-z0-9_-]{20}(?![A-Za-z0-9_-])"),
    ("slack_webhook", r"https://hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]+"),
    ("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("huggingface_token", r"\bhf_[A-Za-z]{34}\b"),
    ("anthropic_key", r"\bsk-ant-[A-Za-z0-9_-]{32,}"),
    ("openai_key",
     r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}T3BlbkFJ[A-Za-z0-9_-]{20,}|\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}"),
    ("stripe_key", r"\b(?:sk|rk)_live_[0-9A-Za-z]{24,}"),
    ("azure_storage_key", r"AccountKey=[A-Za-z0-9+/]{86}==|\bAZURE_[A-Z_]*KEY\s*[=:]\s*['\"]?[A-Za-z0-9+/]{40,}={0,2}"),
    ("aws_secret_access_key",
     r"(?i)aws_?secret_?access_?key\s*[\"']?\s*[=:]\s*[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
    ("assigned_secret", r"(?i)(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|client[_-]?secret"
                        r"|auth[_-]?token|private[_-]?key)[\"']?\s*[=:]\s*[\"']?[^\s\"',;]{12,}"),
    ("email", r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]+\.[A-Za-z]{2,24}\b"),
    ("iban", r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b"),
    ("payment_card", r"(?<![\w.-])(?:\d[ -]?){12,18}\d(?![\w-])"),
    ("national_id", r"\b\d{3}-\d{2}-\d{4}\b|\b\d{3}\.\d{3}\.\d{3}-\d{2}\b|\b[XYZ]?\d{7,8}-?[A-Z]\b"
                    r"|\b\d{4} \d{4} \d{4}\b|\b\d{17}[\dX]\b|\b\d{11}\b"),
    ("phone", r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?![\w])|\(\d{3}\) ?\d{3}-\d{4}\b"),
    ("ip_address",
     r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])|(?<![\w:])(?:[0-9A-Fa-f]{1,4}:){2,7}[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{1,4})*(?![\w:])"),
]
def _scoped(pattern: str) -> str:
    """A leading (?i) becomes (?i:...) so the patterns can be joined into one alternation."""
    return f"(?i:{pattern[4:]})" if pattern.startswith("(?i)") else pattern


_SINGLE = [(name, re.compile(_scoped(pattern))) for name, pattern in _PATTERNS]
_ORDER = {name: i for i, (name, _) in enumerate(_PATTERNS)}
# A kind can only match where one of its literals occurs (checked in lower-cased text; None:
# always possible). Skipping absent kinds keeps the one-pass pattern small: the speed.
_TRIGGERS: dict[str, Optional[tuple[str, ...]]] = {
    "private_key": ("-----begin",), "jwt": ("eyj",),
    "aws_access_key_id": ("akia", "asia", "agpa", "aida", "aroa", "anpa"),
    "gcp_api_key": ("aiza",), "github_token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "gitlab_token": ("glpat-",), "slack_webhook": ("hooks.slack.com",), "slack_token": ("xox",),
    "huggingface_token": ("hf_",),
    "anthropic_key": ("sk-ant-",), "openai_key": ("sk-",), "stripe_key": ("_live_",),
    "azure_storage_key": ("accountkey=", "azure_"),
    "aws_secret_access_key": ("secret",), "assigned_secret": ("pass", "pwd", "secret", "token", "key", "auth"),
    "email": ("@",), "iban": None, "payment_card": None, "national_id": None, "phone": ("+", "("),
    "ip_address": (".", ":"),
}
_DIGIT = re.compile(r"\d")
_DIGIT_KINDS = frozenset({"iban", "payment_card", "national_id", "phone", "ip_address"})


@functools.lru_cache(maxsize=256)
def _combined(kinds: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(f"(?P<{name}>{_scoped(pattern)})" for name, pattern in _PATTERNS if name in kinds))


def active_kinds(text: str) -> tuple[str, ...]:
    """The kinds whose literal triggers occur in ``text`` (compute once for a whole line)."""
    lower = text.lower()
    digits = _DIGIT.search(text) is not None
    return tuple(name for name, _ in _PATTERNS
                 if (digits or name not in _DIGIT_KINDS)
                 and (_TRIGGERS[name] is None or any(t in lower for t in _TRIGGERS[name] or ())))
_SECRET_NAME = re.compile(r"(?i)^[\"']?[a-z_-]*?(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key"
                          r"|client[_-]?secret|auth[_-]?token|private[_-]?key)[\"']?\s*[=:]\s*[\"']?")
RESERVED_EMAIL_DOMAINS = ("example.com", "example.org", "example.net", ".example", ".test", ".invalid", ".localhost")
IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AT": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "CH": 21, "CY": 28, "CZ": 24, "DE": 22,
    "DK": 18, "EE": 20, "ES": 24, "FI": 18, "FR": 27, "GB": 22, "GR": 27, "HR": 21, "HU": 28, "IE": 22, "IL": 23,
    "IS": 26, "IT": 27, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MT": 31, "NL": 18, "NO": 15, "PL": 28,
    "PT": 25, "RO": 24, "SA": 24, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "TR": 26, "UA": 29,
}


@dataclass(frozen=True)
class Finding:
    kind: str
    category: str  # secrets | pii
    start: int
    end: int
    fingerprint: str  # sha256 of kind and value, 16 hex: safe to print and to allowlist
    preview: str  # redacted: never the value

    def where(self) -> str:
        return f"{self.kind} {self.preview} [{self.fingerprint}]"


def fingerprint(kind: str, value: str) -> str:
    return hashlib.sha256(f"{kind}\0{value}".encode()).hexdigest()[:16]


def _preview(kind: str, value: str) -> str:
    keep = 2 if len(value) >= 10 else 0
    return f"{value[:keep]}{'*' * 6}({len(value)} chars)"


# ---- validators -----------------------------------------------------------------------
def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(value: str) -> bool:
    digits = re.sub(r"[ -]", "", value)
    if not 13 <= len(digits) <= 19 or len(set(digits)) < 3:
        return False
    iin = digits[:6]
    known = (digits[0] == "4" or 51 <= int(iin[:2]) <= 55 or 222100 <= int(iin) <= 272099 or iin[:2] in ("34", "37")
             or iin[:4] == "6011" or iin[:2] == "65" or iin[:2] == "35" or iin[:2] in ("36", "38", "30"))
    return known and luhn_ok(digits)


def iban_ok(value: str) -> bool:
    iban = value.replace(" ", "")
    if IBAN_LENGTHS.get(iban[:2]) != len(iban):
        return False
    moved = iban[4:] + iban[:4]
    number = "".join(str(int(ch, 36)) for ch in moved)
    return int(number) % 97 == 1


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(c / len(text) * math.log2(c / len(text)) for c in counts.values())


def _assigned(value: str) -> bool:
    secret = _SECRET_NAME.sub("", value, count=1)
    classes = sum(bool(re.search(p, secret)) for p in (r"[a-z]", r"[A-Z]", r"\d", r"[^A-Za-z0-9]"))
    return len(secret) >= 12 and classes >= 3 and _entropy(secret) >= 3.3 and not secret.startswith(("${", "<", "{{"))


def _jwt(value: str) -> bool:
    import base64

    head = value.split(".")[0]
    try:
        return "alg" in json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (ValueError, UnicodeDecodeError):
        return False


def _email(value: str) -> bool:
    domain = value.rsplit("@", 1)[1].lower()
    return not any(domain == d.lstrip(".") or domain.endswith(d if d.startswith(".") else "." + d) or domain == d
                   for d in RESERVED_EMAIL_DOMAINS)


def _phone(value: str) -> bool:
    if re.fullmatch(r"\+\d+\.\d+", value):  # a signed decimal ("+12780573.2" % in a report), not a number to dial
        return False
    digits = re.sub(r"\D", "", value)
    return 8 <= len(digits) <= 15 and len(set(digits)) > 2


_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")]


def _ip(value: str) -> bool:
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return False
    if ip.version == 6 and value.count(":") < 3:
        return False
    return not (ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_reserved or ip.is_link_local
                or any(ip in net for net in _DOC_NETS))


_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def _verhoeff_ok(num: str) -> bool:
    d = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 0, 6, 7, 8, 9, 5], [2, 3, 4, 0, 1, 7, 8, 9, 5, 6],
         [3, 4, 0, 1, 2, 8, 9, 5, 6, 7], [4, 0, 1, 2, 3, 9, 5, 6, 7, 8], [5, 9, 8, 7, 6, 0, 4, 3, 2, 1],
         [6, 5, 9, 8, 7, 1, 0, 4, 3, 2], [7, 6, 5, 9, 8, 2, 1, 0, 4, 3], [8, 7, 6, 5, 9, 3, 2, 1, 0, 4],
         [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]
    p = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 5, 7, 6, 2, 8, 3, 0, 9, 4], [5, 8, 0, 3, 7, 9, 6, 1, 4, 2],
         [8, 9, 1, 6, 0, 4, 3, 5, 2, 7], [9, 4, 5, 3, 1, 2, 6, 8, 7, 0], [4, 2, 8, 6, 5, 7, 3, 9, 0, 1],
         [2, 7, 9, 3, 8, 0, 6, 4, 1, 5], [7, 0, 4, 6, 9, 1, 3, 2, 5, 8]]
    c = 0
    for i, ch in enumerate(reversed(num)):
        c = d[c][p[i % 8][int(ch)]]
    return c == 0


def national_id_ok(value: str) -> bool:
    """US SSN (structure), Brazilian CPF, Spanish DNI/NIE, Indian Aadhaar (Verhoeff),
    Chinese resident id (ISO 7064 mod 11-2), Polish PESEL: each by its checksum."""
    if re.fullmatch(r"\d{3}-\d{2}-\d{4}", value):
        area, group, serial = value.split("-")
        return area not in ("000", "666") and not area.startswith("9") and group != "00" and serial != "0000"
    if re.fullmatch(r"\d{3}\.\d{3}\.\d{3}-\d{2}", value):
        digits = [int(ch) for ch in re.sub(r"\D", "", value)]
        if len(set(digits)) == 1:
            return False
        for n in (9, 10):
            check = sum(d * w for d, w in zip(digits[:n], range(n + 1, 1, -1))) * 10 % 11 % 10
            if check != digits[n]:
                return False
        return True
    m = re.fullmatch(r"([XYZ]?)(\d{7,8})-?([A-Z])", value)
    if m:
        prefix, number, letter = m.groups()
        if prefix:
            number = str("XYZ".index(prefix)) + number
        return len(number) == 8 and _DNI_LETTERS[int(number) % 23] == letter
    if re.fullmatch(r"\d{4} \d{4} \d{4}", value):
        aadhaar = value.replace(" ", "")
        return aadhaar[0] not in "01" and _verhoeff_ok(aadhaar)
    if re.fullmatch(r"\d{17}[\dX]", value):
        weights = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]
        total = sum(int(ch) * w for ch, w in zip(value[:17], weights))
        return "10X98765432"[total % 11] == value[17] and 1900 <= int(value[6:10]) <= 2100
    if re.fullmatch(r"\d{11}", value):
        weights = [1, 3, 7, 9, 1, 3, 7, 9, 1, 3]
        check = (10 - sum(int(ch) * w for ch, w in zip(value[:10], weights)) % 10) % 10
        month = int(value[2:4]) % 20
        return check == int(value[10]) and 1 <= month <= 12 and 1 <= int(value[4:6]) <= 31
    return False


VALIDATORS: dict[str, Callable[[str], bool]] = {
    "payment_card": _card, "iban": iban_ok, "assigned_secret": _assigned, "jwt": _jwt, "email": _email,
    "phone": _phone, "ip_address": _ip, "national_id": national_id_ok,
}


def scan_text(text: str, categories: frozenset[str] = frozenset({"secrets", "pii"}),
              kinds: Optional[tuple[str, ...]] = None) -> Iterator[Finding]:
    """Every secret / personal datum in ``text`` (validated), in order. One pass of the
    combined pattern; where a validator rejects a match, the kinds after it are tried at the
    same place (a 17-digit run that is no card may be a national id)."""
    kinds = active_kinds(text) if kinds is None else kinds
    if not kinds:
        return
    combined = _combined(kinds)
    pos = 0
    while (match := combined.search(text, pos)) is not None:
        kind_name = match.lastgroup
        assert kind_name is not None  # every alternative of the combined pattern is a named group
        found = _accept(kind_name, match.group(), match.start(), match.end(), categories)
        if found is None:
            for kind, pattern in _SINGLE[_ORDER[kind_name] + 1:]:
                other = pattern.match(text, match.start()) if kind in kinds else None
                if other and (found := _accept(kind, other.group(), other.start(), other.end(), categories)):
                    break
        if found is not None:
            yield found
            pos = max(found.end, match.start() + 1)
        else:
            pos = match.end()


def _accept(kind: str, value: str, start: int, end: int, categories: frozenset[str]) -> Optional[Finding]:
    category = "secrets" if kind in SECRET_KINDS else "pii"
    if category not in categories:
        return None
    validator = VALIDATORS.get(kind)
    if validator is not None and not validator(value):
        return None
    return Finding(kind=kind, category=category, start=start, end=end, fingerprint=fingerprint(kind, value),
                   preview=_preview(kind, value))


def redact(text: str) -> str:
    """``text`` with every finding replaced by ``<kind redacted>``: safe to print."""
    out, last = [], 0
    for finding in scan_text(text):
        out.append(text[last:finding.start])
        out.append(f"<{finding.kind} redacted>")
        last = finding.end
    out.append(text[last:])
    return "".join(out)


def iter_strings(value, path: str = "") -> Iterator[tuple[str, str]]:
    """(field path, text) for everything inside a JSON-like value that a chat template can render
    as text: every string (messages[1].content), every key (``tojson`` renders a tool call's
    arguments whole: messages[1].tool_calls[0].function.arguments (key 1)), every integer (a card
    number given as a number). A key that is not a plain name is named by
    its place in paths, never written out."""
    if isinstance(value, str):
        yield path or "value", value
    elif isinstance(value, int) and not isinstance(value, bool):
        yield path or "value", str(value)
    elif isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            if isinstance(key, str) and key not in _FIELD_NAMES:
                yield f"{path or 'value'} (key {i + 1})", key
            yield from iter_strings(item, _child(path, key, i))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from iter_strings(item, f"{path}[{i}]")


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def _child(path: str, key, i: int) -> str:
    """The path of a dict's item: by its key where the key is a plain name, else by its place
    (a path is printed, and a key may itself be personal data)."""
    plain = key in _FIELD_NAMES or (isinstance(key, str) and _NAME.fullmatch(key)
                                    and next(scan_text(key), None) is None)
    name = key if plain else f"(key {i + 1})"
    return f"{path}.{name}" if path else name


# Keys every row of a layout has: no finding can hide in them, so they are not scanned row by row.
_FIELD_NAMES = frozenset({"messages", "conversations", "role", "content", "from", "value", "type", "text", "tool_calls",
                          "function", "name", "arguments", "id", "tools", "prompt", "completion", "instruction",
                          "input", "output", "system", "history", "reasoning_content", "tool_call_id"})


def joined_parts(value, path: str = "") -> Iterator[tuple[str, str, tuple[int, ...]]]:
    """(field path, joined text, where the parts meet) for every list of two or more text parts
    (``[{"type": "text", "text": ...}, ...]``) inside a JSON-like value: the text a chat template
    renders from them, so that a value split across parts is seen whole."""
    if isinstance(value, dict):
        for i, (key, item) in enumerate(value.items()):
            yield from joined_parts(item, _child(path, key, i))
    elif isinstance(value, (list, tuple)):
        texts = [p["text"] for p in value if isinstance(p, dict) and p.get("type") == "text"
                 and isinstance(p.get("text"), str)]
        if len(texts) > 1:
            cuts, at = [], 0
            for text in texts[:-1]:
                at += len(text)
                cuts.append(at)
            yield f"{path} (text parts joined)", "".join(texts), tuple(cuts)
        for i, item in enumerate(value):
            yield from joined_parts(item, f"{path}[{i}]")


def across_parts(text: str, cuts: tuple[int, ...], categories: frozenset[str] = frozenset({"secrets", "pii"})
                 ) -> Iterator[Finding]:
    """The findings of a ``joined_parts`` text that cross a place where two parts meet (those
    inside one part are found in the part itself)."""
    for finding in scan_text(text, categories):
        if any(finding.start < cut < finding.end for cut in cuts):
            yield finding


def load_allowlist(path: Path | str | None) -> frozenset[str]:
    """Fingerprints of accepted findings: one per line, '#' comments allowed."""
    if not path:
        return frozenset()

    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return frozenset(line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip())
