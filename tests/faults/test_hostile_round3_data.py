"""Hostile rows and thresholds, round three (issue 47's false passes): each case is run as the
check a user runs (on a copy of the tiny example) and must end as a failed check naming the row
and the field, never a pass over what was not judged. Values planted here never appear in a message."""

from __future__ import annotations

import json

import pytest

from tests import planted

USER = {"role": "user", "content": "What does kalo do with the red?"}
ANSWER = {"role": "assistant", "content": "Kalo paints the red."}
GOOD = {"messages": [USER, ANSWER]}


def write_rows(example, *rows) -> None:
    """The training file: four good rows, then ``rows`` (lines 5, 6, ...)."""
    (example / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [GOOD] * 4 + list(rows)))


def chat(*messages, **fields) -> dict:
    return {"messages": list(messages), **fields}


def said(role: str, content, **fields) -> dict:
    return {"role": role, "content": content, **fields}


# ---- 1 and 2: content parts that are not text ---------------------------------------------------
MULTIMODAL = "drop those parts (or rows), or fine-tune them with a multimodal pipeline"

# (id, row, words the data.format message must hold)
PART_CASES = [
    ("assistant-image-only", chat(USER, said("assistant", [{"type": "image"}])),
     ["train.jsonl:5", "messages[1] (assistant) has no text part, only image part(s)", "train nothing", MULTIMODAL]),
    ("image-beside-user-text", chat(said("user", [{"type": "image"}, {"type": "text", "text": "What is it?"}]),
                                    said("assistant", "A cat.")),
     ["train.jsonl:5", "messages[0] (user) is multimodal", "image part(s) beside its text", MULTIMODAL]),
    ("audio-beside-assistant-text", chat(USER, said("assistant", [{"type": "text", "text": "Listen:"},
                                                                   {"type": "input_audio", "input_audio": {}}])),
     ["train.jsonl:5", "messages[1] (assistant) is multimodal", "input_audio part(s)"]),
    ("image-url-and-video", chat(said("user", [{"type": "image_url", "image_url": {"url": "x.png"}},
                                                {"type": "video"}, {"type": "text", "text": "Both?"}]), ANSWER),
     ["image_url, video part(s)"]),
    ("assistant-audio-only", chat(USER, said("assistant", [{"type": "audio"}, {"type": "audio"}])),
     ["messages[1] (assistant) has no text part, only audio part(s)"]),
    ("image-with-blank-text", chat(USER, said("assistant", [{"type": "text", "text": "  "}, {"type": "image"}])),
     ["messages[1] (assistant) has no text part, only image part(s)"]),
    ("text-part-without-text", chat(USER, said("assistant", [{"type": "text"}])),
     ["messages[1].content[0] is a text part without a 'text' string"]),
    ("text-parts-all-blank", chat(USER, said("assistant", [{"type": "text", "text": ""}, {"type": "text", "text": " "}])),
     ["messages[1] (assistant) has empty content (its text parts hold no text)"]),
    ("unknown-part-type", chat(USER, said("assistant", [{"type": "output_text", "text": "hi"}])),
     ["messages[1] (assistant) has no text part, only output_text part(s)"]),
    ("tool-call-turn-with-image", chat(USER, said("assistant", [{"type": "image"}], tool_calls=[
        {"type": "function", "function": {"name": "look", "arguments": {}}}])), ["only image part(s)"]),
    ("images-column", chat(said("user", "<image>What is it?"), said("assistant", "A cat."), images=["cat.png"]),
     ["the row is multimodal: its 'images' column(s) hold media", MULTIMODAL]),
    ("sharegpt-image-part", {"conversations": [{"from": "human", "value": [{"type": "image"},
                                                                            {"type": "text", "text": "What?"}]},
                                               {"from": "gpt", "value": "A cat."}]},
     ["conversations[0] (user) is multimodal"]),
    ("conversational-completion-image", {"prompt": [USER], "completion": [said("assistant", [{"type": "image"}])]},
     ["completion[0] (assistant) has no text part, only image part(s)"]),
    ("alpaca-with-audios", {"instruction": "Transcribe.", "output": "Hello.", "audios": ["a.wav"]},
     ["its 'audios' column(s) hold media"]),
]


@pytest.mark.parametrize("row, words", [c[1:] for c in PART_CASES], ids=[c[0] for c in PART_CASES])
def test_content_that_is_not_text_fails_data_format_naming_the_row(make_state, tiny_example, fails, row, words,
                                                                    edit_recipe):
    if "conversations" in row or "instruction" in row or "prompt" in row:
        edit_recipe(tiny_example / "recipe.toml", format='"auto"')
    write_rows(tiny_example, row)
    message = fails(make_state(), "data.format")
    assert "1 of 5 rows are unusable" in message
    for word in words:
        assert word in message


def test_text_parts_alone_stay_usable(make_state, tiny_example, run_check):
    write_rows(tiny_example, chat(said("user", [{"type": "text", "text": "What does kalo do?"}]),
                                  said("assistant", [{"type": "text", "text": "Kalo "}, {"type": "text", "text": "paints."}])))
    run_check(make_state(), "data.format")


# ---- 4 and 5: personal data and secrets wherever a template renders them ---------------------
CARD_NUMBER = int(planted.CARD)  # a card number as a JSON integer: tojson renders it
EMAIL, PHONE, IBAN = planted.PII["email"], planted.PII["phone"], planted.PII["iban"]
GITHUB, OPENAI = planted.SECRETS["github_token"], planted.SECRETS["openai_key"]


def call(name: str, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def tool_turn(*calls) -> dict:
    return said("assistant", "", tool_calls=list(calls))


def in_parts(*pieces: str) -> list:
    return [{"type": "text", "text": piece} for piece in pieces]


# (id, row, kind found, words of the field named)
PII_CASES = [
    ("tool-call-arguments-object", chat(USER, tool_turn(call("send_mail", {"to": EMAIL}))),
     "email", "messages[1].tool_calls[0].function.arguments.to"),
    ("tool-call-arguments-json-string", chat(USER, tool_turn(call("send_mail", json.dumps({"to": EMAIL})))),
     "email", "messages[1].tool_calls[0].function.arguments"),
    ("arguments-nested-deep", chat(USER, tool_turn(call("book", {"guest": {"contact": {"phones": [PHONE]}}}))),
     "phone", "arguments.guest.contact.phones[0]"),
    ("card-number-as-integer", chat(USER, tool_turn(call("charge", {"card": CARD_NUMBER, "amount": 12}))),
     "payment_card", "arguments.card"),
    ("email-as-argument-key", chat(USER, tool_turn(call("lookup", {EMAIL: True}))),
     "email", "messages[1].tool_calls[0].function.arguments (key 1)"),
    ("phone-under-an-email-key", chat(USER, tool_turn(call("lookup", {"id": 3, EMAIL: {"phone": PHONE}}))),
     "phone", "messages[1].tool_calls[0].function.arguments.(key 2).phone"),
    ("tool-name", chat(USER, tool_turn(call(f"mail_{EMAIL}", {}))), "email", "function.name"),
    ("message-name", chat(said("user", "hi", name=EMAIL), ANSWER), "email", "messages[0].name"),
    ("tool-result", chat(USER, tool_turn(call("whois", {})), said("tool", f"owner: {IBAN}"), ANSWER),
     "iban", "messages[2].content"),
    ("reasoning-content", chat(USER, said("assistant", "Done.", reasoning_content=f"mail {EMAIL} later")),
     "email", "messages[1].reasoning_content"),
    ("tool-schema-description", chat(USER, ANSWER, tools=[{"type": "function", "function": {
        "name": "notify", "description": f"pages {PHONE}", "parameters": {}}}]), "phone", "tools[0].function.description"),
    ("email-split-across-parts", chat(USER, said("assistant", in_parts(EMAIL[:8], EMAIL[8:]))),
     "email", "messages[1].content (text parts joined)"),
]


@pytest.mark.parametrize("row, kind, field", [c[1:] for c in PII_CASES], ids=[c[0] for c in PII_CASES])
def test_personal_data_in_any_rendered_field_fails_privacy_pii(make_state, tiny_example, fails, row, kind, field):
    write_rows(tiny_example, row)
    message = fails(make_state(), "privacy.pii")
    assert "train.jsonl:5 " in message and field in message and kind in message
    assert_never_shown(message)


# (id, pieces of one message's text parts)
SPLIT_SECRETS = [
    ("github-token-over-two-parts", (GITHUB[:12], GITHUB[12:])),
    ("openai-key-over-three-parts", (OPENAI[:10], OPENAI[10:30], OPENAI[30:])),
    ("trigger-itself-split", (GITHUB[:2], GITHUB[2:])),  # not even "ghp_" lies in one part
    ("assigned-password-over-parts", ("db_password = ", "Tr0ub4dor&3x", "K9!zQ")),
]


@pytest.mark.parametrize("pieces", [c[1] for c in SPLIT_SECRETS], ids=[c[0] for c in SPLIT_SECRETS])
def test_a_secret_split_across_text_parts_fails_privacy_secrets(make_state, tiny_example, fails, pieces):
    write_rows(tiny_example, chat(USER, said("assistant", in_parts("Here: ", *pieces, " ok"))))
    message = fails(make_state(), "privacy.secrets")
    assert "train.jsonl:5 messages[1].content (text parts joined)" in message
    assert_never_shown(message)


def test_a_secret_inside_one_part_is_reported_once(make_state, tiny_example, fails):
    write_rows(tiny_example, chat(USER, said("assistant", in_parts("Here: ", GITHUB, " ok"))))
    message = fails(make_state(), "privacy.secrets")
    assert message.startswith("1 secret finding(s)") and "messages[1].content[1].text" in message


def test_a_split_secret_is_found_in_worker_processes_too(tiny_example, tmp_path):
    """The scan in parts (workers) finds what one process finds: the parts' joined text too."""
    from pytest_ftready.privacy.audit import scan_files

    write_rows(tiny_example, chat(USER, said("assistant", in_parts(GITHUB[:10], GITHUB[10:]))))
    path = tiny_example / "data" / "train.jsonl"
    one, _, _ = scan_files([path], frozenset({"secrets"}), workers=1)
    many, _, _ = scan_files([path], frozenset({"secrets"}), workers=2, part_bytes=64)
    assert [(f.line, f.field) for f in one] == [(f.line, f.field) for f in many] == \
        [(5, "messages[1].content (text parts joined)")]


PARTS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
                  "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}"
                  "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def parts_template(example) -> None:
    """[data] chat_template: ChatML that renders text parts (joined as Qwen's and Llama's templates join them)."""
    (example / "parts.jinja").write_text(PARTS_TEMPLATE)
    recipe = example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("[data]\n", "[data]\nchat_template = \"parts.jinja\"\n", 1))


def test_a_split_secret_is_redacted_in_the_masking_report(make_state, tiny_example, run_check):
    parts_template(tiny_example)
    (tiny_example / "data" / "train.jsonl").write_text(
        json.dumps(chat(USER, said("assistant", in_parts("Here: ", GITHUB[:12], GITHUB[12:])))) + "\n")
    state = make_state()
    run_check(state, "data.masking")
    assert GITHUB in state.run.gate.values()  # learnt from the row's joined parts: no output carries it
    (report,) = state.artifacts.rglob("masking.html")
    text = report.read_text()
    assert "github_token redacted" in text and GITHUB[12:20] not in text


def assert_never_shown(message: str) -> None:
    for value in [EMAIL, PHONE, IBAN, str(CARD_NUMBER), GITHUB, OPENAI, "Tr0ub4dor&3xK9!zQ", EMAIL[8:]]:
        assert value not in message


# ---- 6: an overfit target the untrained model already meets --------------------------------------
def test_an_overfit_target_above_the_starting_loss_fails(make_state, fails):
    """overfit_loss = 1000 against a first loss near ln(vocab): met before any update, it proves
    nothing; the run still takes two steps, so every trainable parameter's change is judged."""
    state = make_state(overfit_loss="1000.0")
    message = fails(state, "model.overfit")
    assert "already meets [checks] overfit_loss = 1000.0, so reaching it proves nothing" in message
    assert "set [checks] overfit_loss well below the first loss" in message
    assert len(state.overfit.losses) == 2 and not state.overfit.reached


def test_an_overfit_target_equal_to_the_starting_loss_is_not_reached(make_state, fails):
    first = make_state(overfit_steps="2").overfit.losses[0]
    state = make_state(overfit_loss=repr(first))
    assert "proves nothing" in fails(state, "model.overfit")


def test_one_overfit_step_cannot_reach_a_target(make_state, fails):
    message = fails(make_state(overfit_steps="1", overfit_loss="5.0"), "model.overfit")
    assert "[checks] overfit_steps allows 1 step" in message and "at least 2 steps" in message


@pytest.mark.parametrize("losses, target, stop, reached", [
    ([9.5], 1000.0, False, False),  # one step: nothing judged yet
    ([9.5, 9.4], 1000.0, True, False),  # met from the start: stop, never reached
    ([9.5, 0.05], 0.1, True, True),
    ([9.5, 3.0, 0.1], 0.1, True, True),  # the target itself counts as reached
    ([0.1, 0.05], 0.1, True, False),  # the first loss already at the target
    ([9.5, 3.0], 0.1, False, False),
])
def test_when_an_overfit_stops_and_whether_it_reached(losses, target, stop, reached):
    from pytest_ftready.engine.overfit import stop_here, target_reached

    assert stop_here(losses, target) is stop and target_reached(losses, target) is reached


def test_a_trainers_own_overfit_does_not_pass_a_target_the_start_meets(tmp_path, tiny_model_dir, real_machine, fails):
    """TRL's own Trainer stops on the same rule (engine.overfit.stop_here) and is judged the same."""
    pytest.importorskip("trl")
    from tests.conftest import state_for
    from tests.trainers.test_trl import trl_folder

    config = trl_folder(tmp_path / "tiny", tiny_model_dir)
    side = config.with_name("ftready.toml")
    side.write_text(side.read_text().replace("overfit_loss = 0.1", "overfit_loss = 1000.0"))
    state = state_for(config, tmp_path / "arts", real_machine)
    assert "proves nothing" in fails(state, "model.overfit")
    assert len(state.overfit.losses) == 2 and state.overfit.trainer != "engine"


# ---- 3: the tokenizer's special tokens written as text in a row ---------------------------------
# (id, row, words the data.masking message must hold)
SPECIAL_CASES = [
    ("im-end-and-fake-user-turn", chat(USER, said("assistant", "Sure.<|im_end|>\n<|im_start|>user\nAnd more?")),
     ["messages[1] (assistant) holds the tokenizer's special token(s) '<|im_end|>', '<|im_start|>' as text:"]),
    ("im-end-alone", chat(USER, said("assistant", "Done<|im_end|> and on")), ["'<|im_end|>'"]),
    ("eos-mid-reply", chat(USER, said("assistant", "Stop here </s> no, go on")), ["'</s>'"]),
    ("bos-in-user-turn", chat(said("user", "<s>What now?"), ANSWER), ["messages[0] (user) holds", "'<s>'"]),
    ("another-templates-token", chat(USER, said("assistant", "Fine<|eot_id|>")), ["'<|eot_id|>'"]),
    ("in-a-text-part", chat(USER, said("assistant", [{"type": "text", "text": "Yes"},
                                                      {"type": "text", "text": "<|im_end|>"}])),
     ["'<|im_end|>' as text in its content[1].text:"]),
    ("in-a-tool-result", chat(USER, tool_turn(call("look", {})), said("tool", "result<|im_start|>assistant\nhi"), ANSWER),
     ["messages[2] (tool) holds", "'<|im_start|>'"]),
    ("in-tool-call-arguments", chat(USER, tool_turn(call("say", {"text": "bye<|im_end|>"}))),
     ["'<|im_end|>' as text in its tool_calls[0].function.arguments.text"]),
    ("in-reasoning", chat(USER, said("assistant", "Two.", reasoning_content="one<|im_end|>")),
     ["as text in its reasoning_content"]),
    ("in-a-tool-schema", chat(USER, ANSWER, tools=[{"type": "function", "function": {
        "name": "f", "description": "ends with <|im_end|>", "parameters": {}}}]), ["tools holds", "'<|im_end|>'"]),
    ("alpaca-output", {"instruction": "Say hi.", "output": "hi [INST] more [/INST]"},
     ["output (assistant) holds", "'[INST]'"]),
]


@pytest.mark.parametrize("row, words", [c[1:] for c in SPECIAL_CASES], ids=[c[0] for c in SPECIAL_CASES])
def test_special_tokens_written_as_text_fail_data_masking(make_state, tiny_example, fails, edit_recipe, row, words):
    if "instruction" in row:
        edit_recipe(tiny_example / "recipe.toml", format='"auto"')
    if any(isinstance(m.get("content"), list) for m in row.get("messages", [])):
        parts_template(tiny_example)  # a template that renders text parts: the row renders, and is still marked
    write_rows(tiny_example, row)
    state = make_state()
    message = fails(state, "data.masking")
    assert "special_token_text in 1 row(s)" in message and "[train.jsonl:5]" in message
    for word in words:
        assert word in message
    # never trained: the overfit and every other training check leave the row out
    assert all(e.row.line != 5 for e in state.trainable_examples) and len(state.trainable_examples) == 4


def test_a_token_the_template_uses_in_content_is_allowed(make_state, tiny_example, run_check):
    """A reasoning template splits content on '<think>' and '</think>' (it mentions them, never
    writes them around turns): rows holding them are its convention, not a broken turn."""
    (tiny_example / "think.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
        "{% set thought = m['content'].split('</think>')[0].split('<think>')[-1] %}"
        "{% generation %}{{ m['content'].split('</think>')[-1] }}<|im_end|>{% endgeneration %}\n{% else %}"
        "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}")
    recipe = tiny_example / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("[data]\n", "[data]\nchat_template = \"think.jinja\"\n", 1))
    write_rows(tiny_example, chat(USER, said("assistant", "<think>red</think>Kalo paints the red.")))
    state = make_state()
    run_check(state, "data.masking")
    assert len(state.trainable_examples) == 5


def test_the_examples_a_team_reads_leave_such_rows_out(make_state, tiny_example):
    write_rows(tiny_example, chat(USER, said("assistant", "Sure.<|im_end|>\n<|im_start|>user\nmore")))
    dataset = make_state().dataset
    assert len(dataset) == 4 and "train.jsonl:5" not in dataset["where"]


def test_reserved_tokens_of_the_tiny_tokenizer(make_state):
    from pytest_ftready.data.specials import reserved_tokens

    tokenizer = make_state().tokenizer
    found = reserved_tokens(tokenizer)
    assert {"<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|eot_id|>", "<think>"} <= set(found)
    tokenizer.split_special_tokens = True  # written as text, they stay text
    assert reserved_tokens(tokenizer) == ()


def test_a_reasoning_templates_think_tags_are_content_its_turn_tokens_are_not(make_state):
    """Qwen 3.5's template writes an empty <think></think> block itself and splits content on the
    tags: they are its content convention; <|im_end|> and <|im_start|> stay reserved."""
    from pathlib import Path

    from pytest_ftready.data.specials import reserved_tokens

    tokenizer = make_state().tokenizer
    tokenizer.chat_template = (Path(__file__).parents[1] / "data" / "templates" / "Qwen3.5-4B.jinja").read_text()
    found = set(reserved_tokens(tokenizer))
    assert {"<|im_start|>", "<|im_end|>", "</s>"} <= found and not {"<think>", "</think>"} & found


def test_rows_with_special_tokens_are_marked_the_same_in_worker_processes(make_state, tiny_example):
    from dataclasses import replace as changed

    from pytest_ftready.data.passes import run_pass

    rows = [chat(USER, said("assistant", f"Turn {i}<|im_end|>" if i % 7 == 3 else f"Turn {i}.")) for i in range(60)]
    write_rows(tiny_example, *rows)
    state = make_state()
    plan = changed(state.encoding_plan(), keep_first=0)
    files = state.recipe.data.train
    one = run_pass(files, plan, encoder=state.encoder, workers=1, chunk_bytes=2048)
    two = run_pass(files, plan, encoder=state.encoder, workers=2, chunk_bytes=2048)
    assert one.count("special_token_text") == two.count("special_token_text") == 9
    assert one.trainable == two.trainable == 64 - 9 and one.fingerprint == two.fingerprint


def test_a_trainers_own_pipeline_is_held_to_the_same_rule(tmp_path, tiny_model_dir, real_machine, fails):
    """TRL's SFTTrainer makes the labels: the row is marked all the same (data.digest.marking)."""
    pytest.importorskip("trl")
    from tests.conftest import state_for
    from tests.trainers.test_trl import trl_folder

    config = trl_folder(tmp_path / "tiny", tiny_model_dir)
    write_rows(tmp_path / "tiny", chat(USER, said("assistant", "Sure.<|im_end|>\n<|im_start|>user\nmore")))
    state = state_for(config, tmp_path / "arts", real_machine)
    message = fails(state, "data.masking")
    assert "special_token_text in 1 row(s)" in message and "[train.jsonl:5]" in message
    assert state.run_names()["pipeline"] != "engine"


def test_text_parts_that_join_into_nothing_secret_pass_privacy(make_state, tiny_example, run_check):
    write_rows(tiny_example, chat(USER, said("assistant", in_parts("ghp_", "short", " and ", "sk-", "none"))))
    state = make_state()
    run_check(state, "privacy.secrets")
    run_check(state, "privacy.pii")


def test_a_card_number_as_an_integer_in_a_parquet_file_fails_privacy_pii(make_state, tiny_example, fails, edit_recipe):
    """Tables are read whole (not line by line): the same fields, integers included."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"messages": json.dumps(GOOD["messages"]), "card": 0}] * 3 + [
        {"messages": json.dumps(GOOD["messages"]), "card": CARD_NUMBER}]
    pq.write_table(pa.Table.from_pylist(rows), tiny_example / "data" / "train.parquet")
    edit_recipe(tiny_example / "recipe.toml", train='["data/train.parquet"]')
    message = fails(make_state(), "privacy.pii")
    assert "train.parquet:4 card: payment_card" in message
    assert_never_shown(message)
