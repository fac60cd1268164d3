"""checkpoint.token_rows: the embedding (and untied LM-head) rows of the chat tokens the template,
the stop and the data use, read from the safetensors files alone, judged against the vocabulary's
median row norm. Planted on copies of the real tiny model with a chat token's row changed."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.outcomes import Skip
from tests.conftest import values
from tests.helpers import fails, private_model


def edit_weights(model, change) -> None:
    """``change(tensors)`` applied to the tiny model's model.safetensors (a private copy)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})


def token_id(model, text: str) -> int:
    """The id of added token ``text`` in the model folder's tokenizer.json."""
    added = json.loads((model / "tokenizer.json").read_text())["added_tokens"]
    return next(t["id"] for t in added if t["content"] == text)


def zeroed_chat_token(kit):
    """The registry-wide plant: the tiny model with <|im_end|>'s embedding row zeroed."""
    model = private_model(kit.example)
    im_end = token_id(model, "<|im_end|>")
    edit_weights(model, lambda t: t["model.embed_tokens.weight"][im_end].zero_())
    return kit.make_state()


EMBED = "model.embed_tokens.weight"


def test_the_tiny_model_passes_with_what_it_looked_at(make_state, run_check):
    got = values(run_check(make_state(), "checkpoint.token_rows"))
    assert got["chat_tokens"] == "<s>, <|im_end|>, <|im_start|>"
    assert got["token_rows_checked"] == 3 and got["embedding_vocabulary_rows"] == 1000
    assert got["embedding_tensor"] == f"{EMBED} (model.safetensors)" and "lm_head_tensor" not in got  # tied
    assert got["embedding_median_row_norm"] > 0 and got["token_rows_data_rows"] == 50


def test_a_zeroed_end_of_turn_row_is_named_with_the_remedy(tiny_example, make_state, run_check):
    model = private_model(tiny_example)
    im_end = token_id(model, "<|im_end|>")
    edit_weights(model, lambda t: t[EMBED][im_end].zero_())
    fails(run_check, make_state(), "checkpoint.token_rows", "1 of 3 chat token(s) have untrained rows in model.safetensors",
          f"'<|im_end|>' (id {im_end}, {EMBED}: norm 0, a zero row; the chat template writes it, training teaches "
          "it as the stop token, the data holds it)", "initialise these rows to the mean", "modules_to_save", "the instruct model")


def test_near_zero_and_huge_rows_are_outliers(tiny_example, make_state, run_check):
    model = private_model(tiny_example)
    start, bos = token_id(model, "<|im_start|>"), token_id(model, "<s>")

    def change(tensors):
        tensors[EMBED][start] *= 1e-3  # Llama-3 base's chat tokens: near zero, not zero
        tensors[EMBED][bos] *= 50
    edit_weights(model, change)
    message = fails(run_check, make_state(), "checkpoint.token_rows", "2 of 3 chat token(s)",
                    "below 0.1 x the median", "above 10 x the median")
    assert "<|im_end|>" not in message


def test_an_untied_head_row_is_read_too(tiny_example, make_state, run_check):
    model = private_model(tiny_example)
    im_end = token_id(model, "<|im_end|>")

    def untie(tensors):
        tensors["lm_head.weight"] = tensors[EMBED].clone()
        tensors["lm_head.weight"][im_end].zero_()
    edit_weights(model, untie)
    config = json.loads((model / "config.json").read_text()) | {"tie_word_embeddings": False}
    (model / "config.json").write_text(json.dumps(config))
    state = make_state()
    message = fails(run_check, state, "checkpoint.token_rows", "lm_head.weight: norm 0, a zero row")
    assert f"{EMBED}: norm" not in message
    measured = {m.name: m.value for m in state.run.measurements if m.check == "checkpoint.token_rows"}
    assert measured["lm_head_tensor"] == "lm_head.weight (model.safetensors)"


def test_a_sharded_model_is_read_through_its_weight_map(tiny_example, make_state, run_check):
    from safetensors.torch import load_file, save_file

    model = private_model(tiny_example)
    im_start = token_id(model, "<|im_start|>")
    tensors = load_file(str(model / "model.safetensors"))
    tensors[EMBED][im_start].zero_()
    (model / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": [n for n in names if n != EMBED],
              "model-00002-of-00002.safetensors": [EMBED]}
    for file, held in shards.items():
        save_file({n: tensors[n] for n in held}, str(model / file), metadata={"format": "pt"})
    weight_map = {n: f for f, held in shards.items() for n in held}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    fails(run_check, make_state(), "checkpoint.token_rows", "in model-00002-of-00002.safetensors", "'<|im_start|>'")


def test_an_added_token_only_the_data_uses_is_judged(tiny_example, make_state, run_check):
    model = private_model(tiny_example)
    think = token_id(model, "<think>")
    edit_weights(model, lambda t: t[EMBED][think].zero_())
    run_check(make_state(), "checkpoint.token_rows")  # no row of the data says <think>: not judged
    data = tiny_example / "data" / "train.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    rows[0]["messages"][-1]["content"] = "<think>short</think>" + rows[0]["messages"][-1]["content"]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fails(run_check, make_state(), "checkpoint.token_rows", "'<think>'", "a zero row; the data holds it")


def test_weights_only_as_pickles_are_skipped_with_the_reason(tiny_example, make_state, run_check):
    model = private_model(tiny_example)
    (model / "model.safetensors").rename(model / "pytorch_model.bin")
    with pytest.raises(Skip, match="convert the weights to safetensors"):
        run_check(make_state(), "checkpoint.token_rows")
