"""model.eval_memory: the evaluation step as the trainer runs it (its eval batch, the logits it
keeps for compute_metrics, eval_accumulation_steps) on the real tiny model, beside the memory
that grows with the eval set's size, held against the device (on a CPU: host memory)."""

from __future__ import annotations

import json

import pytest

from pytest_ftready.checks.registry import REGISTRY, all_checks
from pytest_ftready.engine.step import accumulated_eval_bytes
from pytest_ftready.recipe import load_recipe
from tests.conftest import values
from tests.helpers import fails

MAX_LENGTH = 128  # the tiny recipe's
VOCAB = 1000  # the tiny model's
PER_ROW = MAX_LENGTH * (VOCAB * 4 + 8)  # float32 logits + int64 labels of one eval row


def evaluating(example, training: str = "compute_metrics = true", data: str = "eval_split = 0.2"):
    """The tiny recipe with ``training`` and ``data`` lines added to its tables."""
    path = example / "recipe.toml"
    text = path.read_text().replace("[training]\n", f"[training]\n{training}\n", 1)
    path.write_text(text.replace("[data]\n", f"[data]\n{data}\n", 1))


def test_a_recipe_that_evaluates_nothing_is_skipped_with_its_reason(tiny_example):
    all_checks()
    reason = REGISTRY["model.eval_memory"].applies(load_recipe(tiny_example / "recipe.toml"))
    assert "the recipe evaluates nothing" in reason and "eval_split" in reason
    evaluating(tiny_example)
    assert REGISTRY["model.eval_memory"].applies(load_recipe(tiny_example / "recipe.toml")) is None


def test_the_eval_forward_and_the_kept_logits_are_measured_and_fit(tiny_example, make_state, run_check):
    evaluating(tiny_example, "compute_metrics = true\neval_batch_size = 6")
    state = make_state()
    got = values(run_check(state, "model.eval_memory"))
    assert got["eval_rows"] == 10  # 0.2 of the 50 training rows
    assert got["eval_batch_size"] == 6 and state.eval_step.tokens == 6 * MAX_LENGTH
    assert state.eval_step.vocab_size == VOCAB and state.eval_step.logits_element_bytes == 4  # float32 tiny model
    assert got["eval_logits_kept"] is True
    assert got["eval_logits_on_device"] == got["eval_logits_on_host"] == 10 * PER_ROW  # a CPU: the device is host memory
    assert got["eval_peak_bytes"] > 0 and got["optimizer_state"] == state.step.breakdown.optimizer_state_bytes
    assert got["eval_need_bytes"] == got["eval_peak_bytes"] + got["optimizer_state"] + 10 * PER_ROW


def test_without_compute_metrics_or_with_prediction_loss_only_no_logits_are_kept(tiny_example, make_state, run_check):
    evaluating(tiny_example, "compute_metrics = true\nprediction_loss_only = true")
    got = values(run_check(make_state(), "model.eval_memory"))
    assert got["eval_logits_kept"] is False and got["eval_logits_on_device"] == 0


def test_a_huge_eval_set_with_its_logits_kept_fails_naming_the_remedies(tiny_example, make_state, run_check,
                                                                        real_machine):
    usable = real_machine.host.memory_total_bytes * 0.9
    rows = (tiny_example / "data" / "train.jsonl").read_text().splitlines()
    count = int(usable // PER_ROW) + 1  # one more row's logits than this machine's memory holds
    (tiny_example / "data" / "eval.jsonl").write_text("".join(rows[i % len(rows)] + "\n" for i in range(count)))
    evaluating(tiny_example, data='eval = ["data/eval.jsonl"]')
    message = fails(run_check, make_state(), "model.eval_memory", f"accumulate over {count} eval rows",
                    "prediction_loss_only = true", "preprocess_logits_for_metrics",
                    "lower [training] eval_batch_size 4 (micro_batch_size; per_device_eval_batch_size)",
                    "evaluate fewer rows")
    assert f"vocab {VOCAB} x 4 bytes" in message


def test_a_large_eval_batch_fails_on_a_described_small_device(tiny_example, make_state, run_check, real_machine):
    import dataclasses

    evaluating(tiny_example, "eval_batch_size = 32")
    state = make_state()
    peak = state.eval_step.peak_bytes + state.step.breakdown.optimizer_state_bytes
    small = dataclasses.replace(real_machine, host=dataclasses.replace(real_machine.host, memory_total_bytes=peak))
    fails(run_check, make_state(machine=small), "model.eval_memory", "the eval_batch_size 32 forward peaks at",
          "lower [training] eval_batch_size 32")


def test_eval_accumulation_steps_bound_what_stays_on_the_device_not_what_reaches_the_host():
    assert accumulated_eval_bytes(100, 8, MAX_LENGTH, VOCAB, 4, 0) == (100 * PER_ROW, 100 * PER_ROW)
    assert accumulated_eval_bytes(100, 8, MAX_LENGTH, VOCAB, 4, 2) == (16 * PER_ROW, 100 * PER_ROW)
    assert accumulated_eval_bytes(10, 8, MAX_LENGTH, VOCAB, 2, 4) == (10 * MAX_LENGTH * (VOCAB * 2 + 8),) * 2


@pytest.mark.parametrize("config, expected", [
    ("per_device_eval_batch_size: 16\neval_accumulation_steps: 4\nprediction_loss_only: true\n", (16, 4, True)),
    ("", (8, 0, False)),  # transformers' defaults: 8 rows per eval batch, accumulation unset
])
def test_a_trainers_eval_keys_are_translated(tmp_path, config, expected):
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "sft.yaml").write_text("model_name_or_path: model\ndataset_name: data\n" + config)
    recipe = load_recipe(tmp_path / "sft.yaml")
    t = recipe.training
    assert (t.eval_batch_size, t.eval_accumulation_steps, t.prediction_loss_only) == expected
    if config:
        assert ("eval_accumulation_steps", "[training] eval_accumulation_steps") in recipe.origin.mapped


def test_llamafactorys_val_size_becomes_the_eval_split(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"chats": {
        "file_name": "train.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    (tmp_path / "lf.yaml").write_text("model_name_or_path: model\nstage: sft\ndataset: chats\nval_size: 0.1\n"
                                      "per_device_eval_batch_size: 2\neval_strategy: steps\n")
    recipe = load_recipe(tmp_path / "lf.yaml")
    assert recipe.data.eval_split == 0.1 and recipe.training.eval_batch_size == 2
    all_checks()
    assert REGISTRY["model.eval_memory"].applies(recipe) is None


@pytest.mark.parametrize("size, split, noted", [(0.1, 0.1, False), (200, 0.0, True)])
def test_axolotls_val_set_size_is_a_share_or_a_noted_count(tmp_path, size, split, noted):
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "axolotl.yml").write_text(
        f"base_model: model\nmicro_batch_size: 2\neval_batch_size: 3\nval_set_size: {size}\ndatasets:\n"
        "  - path: data/train.jsonl\n    type: chat_template\n")
    recipe = load_recipe(tmp_path / "axolotl.yml")
    assert recipe.data.eval_split == split and recipe.training.eval_batch_size == 3
    assert any(c.startswith("val_set_size") and "200 rows held out" in c for c in recipe.origin.caveats) == noted


LLAMA_VOCAB = 128_256  # Llama 3's


def described_h100(make_state, rows: int, training: str):
    """The tiny recipe on a described 80 GiB H100 evaluating ``rows`` rows at max_length 2048, with the
    engine's figures for a bfloat16 8B model given (what this CPU cannot measure); ``training`` adds keys
    ("": the recipe as an earlier call left it)."""
    from types import SimpleNamespace

    from pytest_ftready.engine.step import EvalMeasurement
    from tests import fakes

    edits = {"max_length": "2048", "micro_batch_size": f"4\neval_batch_size = 8\n{training}"} if training else {}
    state = make_state(machine=fakes.nvidia(), **edits)
    state.eval_rows = rows
    state.eval_step = EvalMeasurement(30 * 1024 ** 3, 80 * 1024 ** 3, 8, 8 * 2048, LLAMA_VOCAB, 2)
    state.step = SimpleNamespace(breakdown=SimpleNamespace(optimizer_state_bytes=1024 ** 3))
    return state


def test_on_a_gpu_unset_eval_accumulation_steps_keeps_every_rows_logits_on_the_device(make_state, run_check):
    state = described_h100(make_state, 2000, "compute_metrics = true")
    message = fails(run_check, state, "model.eval_memory", "accumulate over 2000 eval rows",
                    "set eval_accumulation_steps (moves the kept logits to host memory",
                    "vocab 128256 x 2 bytes")
    from pytest_ftready.units import human_bytes

    assert f"{human_bytes(2000 * 2048 * (LLAMA_VOCAB * 2 + 8))} of logits accumulate" in message


def test_on_a_gpu_eval_accumulation_steps_moves_the_logits_to_a_host_too_small_for_them(make_state, run_check):
    state = described_h100(make_state, 2000, "compute_metrics = true\neval_accumulation_steps = 4")
    message = fails(run_check, state, "model.eval_memory", "the logits of 2000 eval rows reach",
                    "in host memory once moved there", "prediction_loss_only = true")
    assert "eval_accumulation_steps" not in message and "eval_batch_size" not in message  # neither helps the host
    got = values(run_check(described_h100(make_state, 20, ""), "model.eval_memory"))
    assert got["eval_logits_on_device"] == 20 * 2048 * (LLAMA_VOCAB * 2 + 8)  # 20 rows < 4 batches of 8


def test_on_a_gpu_prediction_loss_only_keeps_no_logits_and_fits(make_state, run_check):
    state = described_h100(make_state, 2000, "compute_metrics = true\nprediction_loss_only = true")
    got = values(run_check(state, "model.eval_memory"))
    assert got["eval_logits_on_device"] == got["eval_logits_on_host"] == 0
    assert got["eval_need_bytes"] == 31 * 1024 ** 3


def test_a_missing_eval_file_is_a_recipe_error_naming_the_key(tiny_example):
    from pytest_ftready.recipe.schema import RecipeError

    evaluating(tiny_example, data='eval = ["data/held_out.jsonl"]')
    with pytest.raises(RecipeError, match=r"\[data\] eval.*held_out.jsonl"):
        load_recipe(tiny_example / "recipe.toml")
