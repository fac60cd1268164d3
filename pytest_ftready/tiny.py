"""A real, tiny Llama-style model and chat dataset, built offline and deterministically.

``python -m pytest_ftready.tiny examples/tiny`` (or ``ftready-tiny DIR``) writes
``model/`` (byte-level BPE tokenizer with a ChatML template, ~146k-parameter Llama),
``data/train.jsonl`` (50 chat rows) with its ``MANIFEST.json``, ``recipe.toml`` (where absent),
and ``data/layouts/<layout>.jsonl``: a few of the same
chats in each dataset layout (their recipes are in ``examples/tiny/layouts/``). The plugin's
own tests build their assets with the same functions, so the example and the tests exercise
one real path.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Iterable, Optional

CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = (
    "<s>", "</s>", "<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]", "<think>",
    "</think>",
)
SUBJECTS = ("red", "blue", "green", "river", "mountain", "lamp", "garden", "window", "engine", "market",
            "violin", "harbor", "pepper", "comet", "lantern", "meadow", "canyon", "falcon", "pebble", "orchard")
VERBS = ("likes", "keeps", "paints", "finds", "builds", "carries", "watches", "counts", "hides", "follows")
SYLLABLES = ("ka", "lo", "mi", "zu", "ter", "vin", "qua", "rop", "sel", "dar", "nim", "bex", "yul", "fro")


def _made_up_words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(n)]


def example_rows(n: int = 50, seed: int = 0) -> list[dict]:
    """Short chats (some with a system turn, some two-turn) in ``messages`` format."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        subject, verb = SUBJECTS[i % len(SUBJECTS)], VERBS[(i * 7) % len(VERBS)]
        name = _made_up_words(rng, 1)[0]
        messages = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": "You answer in one short sentence."})
        messages.append({"role": "user", "content": f"What does {name} do with the {subject}?"})
        messages.append({"role": "assistant", "content": f"{name.capitalize()} {verb} the {subject}."})
        if i % 5 == 0:
            messages.append({"role": "user", "content": "And then?"})
            messages.append({"role": "assistant", "content": f"Then {name} rests."})
        rows.append({"messages": messages})
    return rows


LAYOUTS = ("messages", "sharegpt", "alpaca", "prompt_completion", "conversational_prompt_completion", "text")
SHAREGPT_NAMES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}
WEATHER_TOOL = {"type": "function", "function": {"name": "weather", "description": "today's weather in a city",
                                                 "parameters": {"type": "object", "properties": {
                                                     "city": {"type": "string"}}, "required": ["city"]}}}


def layout_rows(layout: str, n: int = 8, seed: int = 1) -> list[dict]:
    """The example chats written in one dataset layout (``LAYOUTS``), with what each layout
    adds: a tool call, an assistant turn marked ``weight: 0``, a ShareGPT observation, an
    Alpaca input and history."""
    chats = [row["messages"] for row in example_rows(n, seed)]
    if layout == "messages":
        rows = [{"messages": chat} for chat in chats]
        two_turn = next(row for row in rows if sum(m["role"] == "assistant" for m in row["messages"]) == 2)
        next(m for m in two_turn["messages"] if m["role"] == "assistant")["weight"] = 0  # train the second only
        return rows + [{"messages": [
            {"role": "user", "content": "What is the weather in Oslo?"},
            {"role": "assistant", "content": "Asking the weather tool.",
             "tool_calls": [{"type": "function", "function": {
                "name": "weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "content": "rain"}, {"role": "assistant", "content": "It rains in Oslo."}],
            "tools": [WEATHER_TOOL]}]
    if layout == "sharegpt":
        rows = [{"conversations": [{"from": SHAREGPT_NAMES[m["role"]], "value": m["content"]} for m in chat]}
                for chat in chats]
        return rows + [{"conversations": [
            {"from": "human", "value": "What is the weather in Oslo?"},
            {"from": "function_call", "value": json.dumps({"name": "weather", "arguments": {"city": "Oslo"}})},
            {"from": "observation", "value": "rain"}, {"from": "gpt", "value": "It rains in Oslo."}]}]
    if layout == "alpaca":
        rows = []
        for i, chat in enumerate(chats):
            system = [m["content"] for m in chat if m["role"] == "system"]
            turns = [m["content"] for m in chat if m["role"] != "system"]
            pairs = [turns[k:k + 2] for k in range(0, len(turns), 2)]
            row = {"instruction": pairs[-1][0], "input": "", "output": pairs[-1][1]}
            if i % 2:
                row.update(instruction="Answer in one short sentence.", input=pairs[-1][0])
            if system:
                row["system"] = system[0]
            if len(pairs) > 1:
                row["history"] = pairs[:-1]
            rows.append(row)
        return rows
    if layout == "conversational_prompt_completion":  # the last answer is the completion
        last = [max(i for i, m in enumerate(chat) if m["role"] == "assistant") for chat in chats]
        return [{"prompt": chat[:k], "completion": chat[k:]} for chat, k in zip(chats, last)]
    if layout == "prompt_completion":  # the first question and answer, as plain strings
        first = [[m["content"] for m in chat if m["role"] != "system"][:2] for chat in chats]
        return [{"prompt": f"Q: {asked}\nA:", "completion": f" {answered}"} for asked, answered in first]
    if layout == "text":
        return [{"text": " ".join(m["content"] for m in chat if m["role"] != "system")} for chat in chats]
    raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


def _corpus(rows: Iterable[dict], seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    texts = [m["content"] for row in rows for m in row["messages"]]
    words = list(SUBJECTS) + list(VERBS) + _made_up_words(rng, 3000)
    texts += [" ".join(rng.choice(words) for _ in range(12)) for _ in range(600)]
    return texts


def build_tokenizer(chat_template: str = CHATML, *, bos: Optional[str] = "<s>", eos: str = "<|im_end|>",
                    pad: str = "<pad>", vocab_size: int = 1000, add_bos: bool = False):
    """A trained byte-level BPE tokenizer wrapped in ``PreTrainedTokenizerFast``.

    ``add_bos``: the tokenizer itself prepends BOS when asked for special tokens (as
    Llama tokenizers do); templates that also write BOS then double it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(example_rows()), trainer=trainer)
    if add_bos and bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad,
                                   unk_token="<unk>", additional_special_tokens=[
                                       t for t in SPECIAL_TOKENS if t not in (bos, eos, pad, "<unk>")])
    fast.chat_template = chat_template
    return fast


def build_model(tokenizer, folder: Path, *, init_range: float = 0.3, seed: int = 0, layers: int = 2,
                hidden: int = 64) -> Path:
    """Save a seeded tiny Llama and ``tokenizer`` to ``folder``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=len(tokenizer),
                         max_position_embeddings=512, tie_word_embeddings=True, initializer_range=init_range,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def build_example(folder: Path) -> Path:
    """The bundled example: ``folder/model``, ``folder/data/train.jsonl`` and, where absent,
    ``folder/recipe.toml`` (the one ``examples/tiny`` holds) and the data's
    ``data/MANIFEST.json``, in a folder only its owner can enter (local is not automatically
    private: privacy.permissions checks it). ``pytest --ftready=folder/recipe.toml`` then runs
    anywhere the package is installed."""
    from importlib.resources import files

    from .data import manifest

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    build_model(build_tokenizer(), folder / "model")
    train = write_jsonl(folder / "data" / "train.jsonl", example_rows())
    for layout in LAYOUTS:
        write_jsonl(folder / "data" / "layouts" / f"{layout}.jsonl", layout_rows(layout))
    recipe = folder / "recipe.toml"
    if not recipe.exists():  # never replace a recipe someone edited
        recipe.write_text(files(__package__).joinpath("tiny_recipe.toml").read_text(encoding="utf-8"), encoding="utf-8")
    if not (folder / "data" / "MANIFEST.json").exists():
        manifest.write([train], folder / "data" / "MANIFEST.json")
    return folder


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ftready-tiny", description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="examples/tiny", help="where to write model/ and data/")
    args = parser.parse_args(argv)
    folder = build_example(Path(args.folder))
    print(f"built {folder / 'model'}, {folder / 'data' / 'train.jsonl'} and {folder / 'data' / 'layouts'}/; "
          f"run: pytest --ftready={folder / 'recipe.toml'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
