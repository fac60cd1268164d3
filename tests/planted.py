"""A planted corpus: one valid value of every secret and personal-data kind, and decoys
that look alike but must not be reported. Values are generated valid (Luhn, mod 97, ...)."""

from __future__ import annotations

import base64
import json
import random

_rng = random.Random(7)
ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def _r(n: int, alphabet: str = ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _luhn_complete(prefix: str) -> str:
    for d in "0123456789":
        digits = prefix + d
        total = sum((int(c) * 2 - 9 if int(c) * 2 > 9 else int(c) * 2) if i % 2 else int(c)
                    for i, c in enumerate(reversed(digits)))
        if total % 10 == 0:
            return digits
    raise AssertionError


def _b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


def _aadhaar() -> str:
    from pytest_ftready.privacy.scan import _verhoeff_ok

    while True:
        digits = str(_rng.randint(2, 9)) + "".join(str(_rng.randint(0, 9)) for _ in range(11))
        if _verhoeff_ok(digits):
            return f"{digits[:4]} {digits[4:8]} {digits[8:]}"


CARD = _luhn_complete("453914880343646")
# kind -> (planted value, sentence it sits in)
SECRETS = {
    "private_key": "-----BEGIN RSA PRIVATE KEY-----",
    "aws_access_key_id": "AKIA" + _r(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
    "aws_secret_access_key": "aws_secret_access_key = " + _r(40, ALNUM + "/+"),
    "gcp_api_key": "AIza" + _r(35, ALNUM + "_-"),
    "azure_storage_key": "AccountKey=" + _r(86, ALNUM + "+/") + "==",
    "github_token": "ghp_" + _r(36),
    "gitlab_token": "glpat-" + _r(20),
    "slack_token": "xoxb-" + _r(12, "0123456789") + "-" + _r(24),
    "slack_webhook": "https://hooks.slack.com/services/T" + _r(8, "ABCDEFGHIJ0123456789") + "/B" + _r(8, "ABCDEFGHIJ0123456789") + "/" + _r(24),
    "huggingface_token": "hf_" + _r(34, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    "openai_key": "sk-proj-" + _r(48, ALNUM + "_-"),
    "anthropic_key": "sk-ant-api03-" + _r(40, ALNUM + "_-"),
    "stripe_key": "sk_live_" + _r(24),
    "jwt": _b64({"alg": "HS256", "typ": "JWT"}) + "." + _b64({"sub": "1234567890", "name": "x"}) + "." + _r(43, ALNUM + "_-"),
    "assigned_secret": "db_password = Tr0ub4dor&3xK9!zQ",
}
PII = {
    "email": "jane.doe.42@gmail.com",
    "phone": "+44 20 7946 0958",
    "payment_card": f"{CARD[:4]} {CARD[4:8]} {CARD[8:12]} {CARD[12:]}",
    "iban": "DE89 3704 0044 0532 0130 00",
    "ip_address": "81.2.69.160",
    "national_id": "529.982.247-25",
}
MORE_IDS = ["123-45-6789", "12345678Z", "11010519491231002X", "44051401359", _aadhaar(), "GB82WEST12345698765432",
            "2a00:1450:4001:81b::200e"]
DECOYS = [
    "4111 1111 1111 1112",  # fails Luhn
    "1234 5678 9012 3455",  # fails Luhn
    "123e4567-e89b-12d3-a456-426614174000",  # a UUID
    "e83c5163316f89bfbde7d9ab23ca2e25604af290",  # a git commit
    "VGhlIHF1aWNrIGJyb3duIGZveCBqdW1wcyBvdmVyIHRoZSBsYXp5IGRvZw==",  # base64 of ordinary text
    "write to someone@example.com for help",  # documentation domain
    "the docs use 192.0.2.1 and 127.0.0.1",  # documentation and loopback addresses
    "password = ${DB_PASSWORD}",  # a placeholder, not a secret
    "token = aaaaaaaaaaaaaaaaaaaa",  # no entropy
    "DE89 3704 0044 0532 0130 01",  # IBAN failing mod 97
    "000-12-3456",  # not a valid SSN area
    "12345678A",  # DNI with the wrong letter
    "version 2.13.0 released on 2026-11-29",
]


def rows() -> list[dict]:
    """Chat rows: one planted value per row, then the decoys."""
    out = []
    for kind, value in {**SECRETS, **PII}.items():
        out.append({"messages": [{"role": "user", "content": f"Here it is: {value} thanks"},
                                 {"role": "assistant", "content": "Noted."}], "kind": kind})
    for value in MORE_IDS:
        out.append({"messages": [{"role": "user", "content": f"id {value}"}, {"role": "assistant", "content": "ok"}]})
    for decoy in DECOYS:
        out.append({"messages": [{"role": "user", "content": decoy}, {"role": "assistant", "content": "Fine."}]})
    return out


def planted_values() -> list[str]:
    """Every planted value (the part that must never appear in any output)."""
    values = [v.split(" = ")[-1].split("=", 1)[-1] if k in ("aws_secret_access_key", "azure_storage_key", "assigned_secret")
              else v for k, v in SECRETS.items() if k != "private_key"]
    return values + list(PII.values()) + MORE_IDS


# ---- secrets that byte-level BPE splits over many tokens, in assistant turns ----------------
_B64 = ALNUM + "+/"
PEM_BLOCK = ("-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(_r(64, _B64) for _ in range(5)) + "\n" + _r(24, _B64)
             + "==\n-----END RSA PRIVATE KEY-----")
SPLIT = {  # kind -> (the value the scanner finds, the part that must never be shown)
    "aws_secret_access_key": ("aws_secret_access_key = " + (_aws := _r(40, _B64)), _aws),
    "private_key": (PEM_BLOCK, PEM_BLOCK),
    "jwt": (SECRETS["jwt"], SECRETS["jwt"]),
    "payment_card": (PII["payment_card"], PII["payment_card"]),
    "email": (PII["email"], PII["email"]),
}
FILLER = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)


def plant_in_assistant_turns(rows: list[dict]) -> list[dict]:
    """The first rows' assistant turn carries one SPLIT value each, followed by enough filler
    that the row is truncated (so the masking report shows it); the PEM block and the JWT are
    long enough to be cut in the middle by max_length = 128."""
    rows = [dict(r) for r in rows]
    for i, (kind, (value, _)) in enumerate(SPLIT.items()):
        cut = kind in ("private_key", "jwt")
        text = f"Here it is:\n{value}\n" + ("" if cut else FILLER)
        rows[i] = {"messages": [{"role": "user", "content": "What do you have for me?"},
                                {"role": "assistant", "content": text}]}
    return rows


def never_shown() -> list[str]:
    """Everything that must appear in no output: each SPLIT secret, each line of the PEM
    block, and every 12-character window of each (a value cut short is still a leak)."""
    needles = set()
    for _, secret in SPLIT.values():
        needles.add(secret)
        for line in secret.splitlines():
            if line.startswith("-----"):
                continue  # the BEGIN/END lines name the kind, not the key
            needles.add(line)
            needles.update(line[i:i + 12] for i in range(max(1, len(line) - 11)))
    return sorted(needles)


def leaky_attention() -> str:
    """Register (once) and name an attention that ignores packing's example boundaries: causal
    over the whole packed row, as a kernel that drops position_ids would be."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def leaky(module, query, key, value, attention_mask, **kwargs):
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    AttentionInterface.register("leaky_causal", leaky)
    return "leaky_causal"
