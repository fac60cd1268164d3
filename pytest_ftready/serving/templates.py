"""A served prompt against the trained one: the serving engine's render of each sampled training
conversation's inference prompt, tokenized as the server tokenizes it, held against the training
render's token ids (BOS once, the same special tokens), and the served template's close of an
assistant turn against the trained end-of-turn token. The engine is two functions: its render
and its tokenizer (transformers' for a serving .jinja, llama.cpp's for a GGUF)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


@dataclass(frozen=True)
class Conversation:
    where: str  # file:line of the row
    prompt: list  # the messages before the (last) trained answer
    answer: str  # that answer's content
    trained_ids: list  # the training render's inference prompt ids


@dataclass
class Agreement:
    prompts: int = 0
    agreeing: int = 0
    problems: list = field(default_factory=list)  # one line per finding


def conversations(state, most: int) -> list[Conversation]:
    """The first ``most`` sampled training conversations (the data pass's head) with their
    training inference prompt ids (``Encoder.prompt_ids``, as lifecycle.generate prompts)."""
    from ..data.layouts import Chat

    encoder, out = state.encoder, []
    for encoded in state.digest.head:
        sample = encoder.sample(encoded.row)
        if not isinstance(sample, Chat) or not sample.trained:
            continue
        last = max(sample.trained)
        out.append(Conversation(encoded.row.where, list(sample.messages[:last]),
                                str(sample.messages[last].get("content") or ""), encoder.prompt_ids(encoded.row)))
        if len(out) >= most:
            break
    return out


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(convs: Sequence[Conversation], render: Callable, tokenize: Callable, describe: Callable,
            bos_id: Optional[int], stop_texts: Sequence[str], what: str) -> Agreement:
    """``render(messages, add_generation_prompt) -> text``, ``tokenize(text) -> ids`` (as the server
    does), ``describe(ids) -> str`` for messages; ``stop_texts``: the trained end-of-turn tokens."""
    result = Agreement()
    differing = []
    for conv in convs:
        result.prompts += 1
        served = tokenize(render(conv.prompt, True))
        if bos_id is not None and served[:2] == [bos_id, bos_id]:
            differing.append(f"{conv.where}: {what} starts the prompt with BOS twice ({describe(served[:2])!r}): "
                                   "the template writes the BOS token and the server adds its own; remove "
                                   "{{ bos_token }} from the template (or have the server not add one)")
            continue
        at = first_divergence(served, conv.trained_ids)
        if at is None:
            result.agreeing += 1
        else:
            differing.append(f"{conv.where}: {what} renders the inference prompt to {len(served)} tokens, "
                                   f"training to {len(conv.trained_ids)}; first difference at token {at}: served "
                                   f"{describe(served[at:at + 4])!r}, "
                                   f"trained {describe(conv.trained_ids[at:at + 4])!r}")
    if differing:
        more = len(differing) - 1
        result.problems.append(differing[0]
                               + (f" (and {more} more of the {result.prompts} sampled prompts)" if more else ""))
    if convs and stop_texts and convs[0].answer:
        conv = convs[0]
        full = render([*conv.prompt, {"role": "assistant", "content": conv.answer}], False)
        end = full.rfind(conv.answer)
        after = full[end + len(conv.answer):] if end >= 0 else full
        if not any(s in after for s in stop_texts):
            result.problems.append(f"{conv.where}: {what} closes an assistant turn with {after[:40]!r}, without the "
                                   f"trained end-of-turn token {' or '.join(stop_texts)}: the model was trained to "
                                   "stop on it; the served history lacks it and the model runs on. Use the training "
                                   "chat template (or add the end-of-turn token after each assistant message)")
    return result


def transformers_engine(tok, template: str):
    """(render, tokenize, describe) of a server given ``template`` with this tokenizer (vLLM
    --chat-template, transformers): the template rendered, the text tokenized adding the
    tokenizer's own special tokens, as a server that prepends the model's BOS does."""
    def render(messages, add_generation_prompt):
        return tok.apply_chat_template(list(messages), chat_template=template, tokenize=False,
                                       add_generation_prompt=add_generation_prompt)

    return (render, *server_tokenizer(tok))


def server_tokenizer(tok):
    """(tokenize, describe) of a server that tokenizes a rendered prompt with this tokenizer:
    special tokens written in the text parsed as special (as llama.cpp and Ollama do), the
    tokenizer's own special tokens (BOS where it adds one) added."""
    def tokenize(text):
        return list(tok(text, add_special_tokens=True)["input_ids"])

    return tokenize, tok.decode


def stop_texts(tok, stop_ids) -> list[str]:
    """The trained end-of-turn tokens as text (``<|im_end|>``, ``</s>``)."""
    return [t for t in tok.convert_ids_to_tokens(sorted(stop_ids)) if t]
