"""A large generated chat JSONL for the scale benchmarks: ~600 characters a row of ordinary
chat text (words, numbers, dates, versions, code-ish punctuation), with every planted kind of
tests/planted.py sprinkled in, the decoys, and secrets hidden behind JSON escapes (a PEM block
whose newlines are ``\\n``, an e-mail whose ``@`` is ``\\u0040``). Deterministic for a seed.
``text`` writes the ordinary rows' contents in another script: ``ascii`` (as generated),
``typographic`` (curly quotes and apostrophes, dashes, ellipses: English as editors write it)
or ``cyrillic`` (every Latin letter as a Cyrillic one: two UTF-8 bytes each)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from pytest_ftready.tiny import example_rows
from tests import planted

WORDS = ("the model trains on short chats about weather cooking travel code and music while the loss "
         "goes down slowly because the learning rate warms up over steps and batches of tokens").split()
SENTENCES = [
    "Version 2.13.0 was released on 2026-11-29 at 14:05:33 with 3 fixes.",
    "The run used 8 GPUs, batch size 32 and 4096 tokens; loss fell from 2.71 to 1.38.",
    "Use `def f(x): return x * 2` and call f(21) to get 42.",
    "Meeting notes: item 1 - budget (12,500 EUR); item 2 - hiring; item 3 - the Q3 plan.",
    "She said: \"I'll be there by 7:30, room 214, building C.\"",
    "Temperatures ranged from -3.5 to +12.7 degrees over 10 days.",
]
# Written as raw JSON lines so the escapes survive: the scanner reads the bytes.
ESCAPED = [
    json.dumps({"messages": [{"role": "user", "content": "my key:\n" + planted.PEM_BLOCK},
                             {"role": "assistant", "content": "Please rotate it."}]}),
    '{"messages": [{"role": "user", "content": "write to jane.roe.77\\u0040gmail.com today"}, '
    '{"role": "assistant", "content": "Done."}]}',
]
ESCAPED_KINDS = ("private_key", "email")
TEXTS = {
    "ascii": None,
    "typographic": str.maketrans({"'": "\u2019", '"': "\u201d", "-": "\u2013", ";": "\u2026"}),
    "cyrillic": str.maketrans("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                              "абцдефгхийклмнопярстуввхызАБЦДЕФГХИЙКЛМНОПЯРСТУВВХЫЗ"),
}


def _filler(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        part = rng.choice(SENTENCES) if rng.random() < 0.3 else " ".join(rng.choices(WORDS, k=12)).capitalize() + "."
        out.append(part)
        size += len(part) + 1
    return " ".join(out)


def write_corpus(path: Path, rows: int, seed: int = 11, plant_every: int = 500, text: str = "ascii") -> dict:
    """Write ``rows`` JSONL rows to ``path``; every ``plant_every``-th row carries a planted
    value, a decoy or an escaped secret. Returns {"rows", "bytes", "planted": {kind: count}}."""
    table = TEXTS[text]
    rng = random.Random(seed)
    base = example_rows(300, seed=5)
    plants = planted.rows()
    counts: dict[str, int] = {}
    size = 0
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(rows):
            if i % plant_every == plant_every - 1:
                k = (i // plant_every) % (len(plants) + len(ESCAPED))
                if k < len(plants):
                    row = plants[k]
                    line = json.dumps(row)
                    if "kind" in row:
                        counts[row["kind"]] = counts.get(row["kind"], 0) + 1
                else:
                    line = ESCAPED[k - len(plants)]
                    kind = ESCAPED_KINDS[k - len(plants)]
                    counts[kind] = counts.get(kind, 0) + 1
            else:
                chat = [dict(m) for m in rng.choice(base)["messages"]]
                chat[-1]["content"] += " " + _filler(rng, 480)
                if table is not None:
                    chat = [{**m, "content": m["content"].translate(table)} for m in chat]
                line = json.dumps({"messages": chat}, ensure_ascii=table is None)  # UTF-8, as such files are
            handle.write(line + "\n")
            size += len(line.encode("utf-8")) + 1
    return {"rows": rows, "bytes": size, "planted": counts}


if __name__ == "__main__":  # python -m tests.benchmarks.corpus OUT.jsonl ROWS [ascii|typographic|cyrillic]
    import sys

    print(write_corpus(Path(sys.argv[1]), int(sys.argv[2]), text=sys.argv[3] if len(sys.argv) > 3 else "ascii"))


def plain_labels(tok, rows) -> list:
    """The plain labelling script the encoder is compared with: each row rendered by
    ``apply_chat_template`` with its assistant mask, the labels -100 outside it."""
    out = []
    for r in rows:
        done = tok.apply_chat_template(r.data["messages"], tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True)
        out.append([t if m else -100 for t, m in zip(done["input_ids"], done["assistant_masks"])])
    return out


def plain_tokenizing(tok, texts) -> list:
    """The tokenizing ``plain_labels`` does, alone: each rendered text tokenized by one call as
    ``apply_chat_template`` tokenizes it, its offsets read from the encoding as it reads them."""
    out = []
    for text in texts:
        done = tok(text, add_special_tokens=False)
        out.append((done["input_ids"], done.encodings[0].offsets))
    return out
