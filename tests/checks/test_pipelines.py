"""data.masking judges the labels of the pipeline the team will run: TRL's SFTTrainer (its
real code), or their own function from conftest.py; the built-in encoder stays the default."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_ftready.outcomes import Fail
from pytest_ftready.recipe import load_recipe
from pytest_ftready.session.state import RunState
from pytest_ftready.tiny import CHATML

pytest.importorskip("trl")  # the test extra installs it

ROOT = Path(__file__).resolve().parents[2]
NO_MARKERS = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")


@pytest.fixture
def trl_config(tiny_example):
    """The tiny example's TRL config (+ ftready.toml) in a private folder."""
    for name in ("trl-sft.yaml", "ftready.toml"):
        shutil.copy(ROOT / "examples" / "tiny" / name, tiny_example / name)
    return tiny_example / "trl-sft.yaml"


def state_for(path, tmp_path, real_machine, hook=None):
    from pytest_ftready.checks.registry import all_checks

    all_checks()
    run = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: real_machine, pipeline_hook=hook)
    return run.recipe_state(load_recipe(path))


def test_trl_with_a_marked_template_passes_on_trls_own_labels(trl_config, tmp_path, real_machine, run_check):
    state = state_for(trl_config, tmp_path, real_machine)
    assert state.pipeline.name == "trl"
    ctx = run_check(state, "data.masking")
    values = {m.name: m.value for m in ctx.measured}
    assert values["pipeline"] == "trl" and values["trained_span_method"] == "TRL SFTTrainer"
    assert 0 < values["trained_token_share"] < 0.5
    # the labels are TRL's: the same ids TRL's prepared dataset holds, user turns masked
    first = state.digest.head[0]
    assert first.trained and first.labels[0] == -100
    batch = state.pipeline.collate(state.digest.head[:2], state.tokenizer.pad_token_id)
    assert batch["labels"].shape == batch["input_ids"].shape  # TRL's collator
    # TRL's rows are still conversations: data.template names the template they render through
    template = {m.name: m.value for m in run_check(state, "data.template").measured}
    assert template["template_source"] in ("chat_template.jinja", "tokenizer_config.json"), template["template_source"]


def test_trl_with_an_unmarked_template_fails_saying_what_trl_does(trl_config, tmp_path, real_machine, run_check):
    (trl_config.parent / "plain.jinja").write_text(NO_MARKERS)
    text = trl_config.read_text() + "chat_template_path: plain.jinja\n"
    trl_config.write_text(text)
    state = state_for(trl_config, tmp_path, real_machine)
    with pytest.raises(Fail) as info:
        run_check(state, "data.masking")
    message = str(info.value)
    assert "refuses to start" in message and "generation" in message  # what TRL does, from TRL's own error
    assert "completion_only_loss" in message and "prefix-diff" in message  # how to fix it
    # the built-in pipeline on the same recipe would pass (prefix-diff): the failure is TRL's
    trl_config.write_text(text)
    side = trl_config.parent / "ftready.toml"
    side.write_text(side.read_text().replace("[data]\n", "[data]\npipeline = \"builtin\"\n"))
    run_check(state_for(trl_config, tmp_path, real_machine), "data.masking")


def _correct(tokenizer):
    """A team's function: prefix-diff labels (assistant turns and their end-of-turn token only)."""
    def encode(row):
        messages = row["messages"]
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        labels = [-100] * len(ids)
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                start = len(tokenizer.apply_chat_template(messages[:i], tokenize=True, return_dict=True,
                                                          add_generation_prompt=True)["input_ids"])
                end = len(tokenizer.apply_chat_template(messages[:i + 1], tokenize=True, return_dict=True)["input_ids"])
                end -= 1  # the newline after <|im_end|> is never generated
                labels[start:end] = ids[start:end]
        return {"input_ids": ids, "labels": labels}
    return encode


def _trains_the_user_turn(tokenizer):
    correct = _correct(tokenizer)

    def encode(row):
        example = correct(row)
        return {"input_ids": example["input_ids"], "labels": list(example["input_ids"])}
    return encode


def test_a_team_pipeline_is_judged_by_the_same_verification(tiny_example, tmp_path, real_machine, run_check):
    recipe = tiny_example / "recipe.toml"
    wrong = state_for(recipe, tmp_path, real_machine, hook=lambda r, tok: _trains_the_user_turn(tok))
    trained_user = r"wrong_role_trained in \d+ row\(s\): \d+ tokens of messages\[\d\] \((user|system)\)"
    with pytest.raises(Fail, match=trained_user):
        run_check(wrong, "data.masking")
    right = state_for(recipe, tmp_path, real_machine, hook=lambda r, tok: _correct(tok))
    ctx = run_check(right, "data.masking")
    assert {m.name: m.value for m in ctx.measured}["pipeline"] == "conftest"


CONFTEST = '''
def pytest_ftready_pipeline(recipe, tokenizer):
    def encode(row):
        ids = tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)["input_ids"]
        return {"input_ids": ids, "labels": list(ids)}  # trains every token, user turns too
    return encode
'''


@pytest.mark.slow  # whole pytest runs: CI's second line (pytest tests -m "slow or faults_slow")
def test_a_conftest_pipeline_hook_is_what_data_masking_checks(pytester, tiny_example):
    from tests.helpers import outcomes

    pytester.makeconftest(CONFTEST)
    pytester.runpytest_subprocess(f"--ftready={tiny_example / 'recipe.toml'}", "-k", "data.masking",
                                  "--junitxml=out.xml", "-p", "no:cacheprovider")
    state, message = outcomes(pytester.path / "out.xml")["data.masking"]
    assert state == "failed" and "wrong_role_trained" in message and "system turns do not train under" in message


def test_where_trl_substitutes_its_training_template_those_labels_are_verified(trl_config, tmp_path, real_machine,
                                                                                run_check):
    import trl

    qwen = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"  # a stock template TRL knows
    shutil.copy(qwen, trl_config.parent / "qwen.jinja")
    trl_config.write_text(trl_config.read_text() + "chat_template_path: qwen.jinja\n")
    state = state_for(trl_config, tmp_path, real_machine)
    ctx = run_check(state, "data.masking")
    assert state.pipeline.substituted_template  # TRL swapped in its {% generation %} variant
    assert "substituted training template" in {m.name: m.value for m in ctx.measured}["trained_span_method"]
    text = state.tokenizer.decode([t for t, label in zip(state.digest.head[0].input_ids, state.digest.head[0].labels)
                                   if label != -100])
    assert "likes the" in text and "What does" not in text  # the assistant turn, not the user's


def test_trl_pipeline_without_trl_skips_naming_the_extra(trl_config, tmp_path, real_machine, run_check, monkeypatch):
    from pytest_ftready.outcomes import Skip

    monkeypatch.setitem(__import__("sys").modules, "trl", None)  # import trl -> ImportError
    with pytest.raises(Skip, match=r"pip install 'pytest-ftready\[trl\]'"):
        run_check(state_for(trl_config, tmp_path, real_machine), "data.masking")


def test_trls_collator_pads_like_the_engine(trl_config, tmp_path, real_machine):
    from pytest_ftready.engine.batches import collate

    state = state_for(trl_config, tmp_path, real_machine)
    examples = state.digest.head[:3]
    theirs = state.pipeline.collate(examples, state.tokenizer.pad_token_id)
    ours = collate(examples, state.tokenizer.pad_token_id)
    for key in ("input_ids", "labels", "attention_mask"):
        assert theirs[key].tolist() == ours[key].tolist()  # the model checks' batches equal TRL's


def test_a_pipeline_that_trains_nothing_says_so(tiny_example, tmp_path, real_machine, run_check):
    """What an all-zero assistant mask does (TRL versions that warn instead of refusing): no token trained."""
    def all_masked(recipe, tok):
        return lambda row: {"input_ids": _correct(tok)(row)["input_ids"],
                            "labels": [-100] * len(_correct(tok)(row)["input_ids"])}

    state = state_for(tiny_example / "recipe.toml", tmp_path, real_machine, hook=all_masked)
    with pytest.raises(Fail, match=r"conftest pipeline would train on 0 tokens of 50 rows"):
        run_check(state, "data.masking")


def test_rows_trl_cannot_load_as_one_dataset_fail_with_the_reason(trl_config, tmp_path, real_machine, run_check):
    data = trl_config.parent / "data" / "train.jsonl"
    lines = data.read_text().splitlines()
    lines[0] = lines[0][:-1] + ', "meta": 1}'
    lines[1] = lines[1][:-1] + ', "meta": "x"}'
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(Fail, match=r"the rows do not form one datasets.Dataset, as TRL needs them .*same fields"):
        run_check(state_for(trl_config, tmp_path, real_machine), "data.masking")


def test_a_toml_recipe_can_ask_for_trls_pipeline(make_state, run_check):
    state = make_state(packing='false\npipeline = "trl"')
    ctx = run_check(state, "data.masking")
    assert {m.name: m.value for m in ctx.measured}["pipeline"] == "trl"
    assert state.digest.head[0].method == "TRL SFTTrainer"
