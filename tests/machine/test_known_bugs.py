"""Known bugs of the stack: every row of compat/known_bugs.toml in a situation where it applies
and one where it does not (installed versions given as data), the table's validation, and the
check stack.known_bugs on fake machines (the probes' Machine records, packages as data)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pytest_ftready.checks.registry import REGISTRY, all_checks
from pytest_ftready.machine.known_bugs import Situation, judge, known_bugs, needs_model_type, parse_bugs
from pytest_ftready.outcomes import Skip
from pytest_ftready.outputs.records import CheckRow, RecipeRun
from pytest_ftready.outputs.report import html_report
from pytest_ftready.outputs.summary import markdown
from pytest_ftready.recipe.schema import parse_recipe
from pytest_ftready.session.context import CheckContext
from pytest_ftready.session.state import RunState
from tests import fakes
from tests.helpers import fails

H100, A100, B200 = (9, 0), (8, 0), (10, 0)


def gpu(**kw) -> Situation:
    return Situation(device="cuda", **kw)


# row id -> (a situation where the row applies, the changes that make it not apply)
CASES = {
    "transformers-ga-loss-normalisation": (
        Situation(packages={"transformers": "4.45.2"}, gradient_accumulation_steps=8, trainer="trl"),
        {"packages": {"transformers": "4.46.0"}}),
    "transformers-4.47.0-ga-loss-scaled": (
        Situation(packages={"transformers": "4.47.0"}, gradient_accumulation_steps=2, trainer="axolotl"),
        {"packages": {"transformers": "4.47.1"}}),
    "transformers-4.48.0-ga-loss-scaled": (
        Situation(packages={"transformers": "4.48.0"}, gradient_accumulation_steps=4, trainer="llamafactory"),
        {"gradient_accumulation_steps": 1}),
    "transformers-peft-checkpointing-trainer": (
        Situation(packages={"transformers": "5.0.0rc1"}, adapter="lora", gradient_checkpointing=True,
                  trainer="transformers"),
        {"trainer": "trl"}),
    "transformers-gemma2-sdpa-softcapping": (
        Situation(packages={"transformers": "4.44.2"}, model_type="gemma2", attn="sdpa"),
        {"attn": "eager"}),
    "transformers-gemma3-float16": (
        Situation(packages={"transformers": "4.51.0"}, model_type="gemma3_text", dtype="float16"),
        {"dtype": "bfloat16"}),
    "flash-attn-gemma2-no-softcapping": (
        gpu(packages={"flash-attn": "2.5.9"}, model_type="gemma2", attn="flash_attention_2", capability=A100),
        {"packages": {"flash-attn": "2.6.3"}}),
    "flash-attn-2.0-backward-nan": (
        gpu(packages={"flash_attn": "2.0.4"}, attn="flash_attention_2", capability=A100),
        {"packages": {"flash_attn": "2.1.0"}}),
    "torch-2.5.0-cudnn-sdpa": (
        gpu(packages={"torch": "2.5.0+cu124"}, attn="sdpa", capability=H100),
        {"capability": A100}),
    "torch-cudnn-sdpa-backward-nan-seq64": (
        gpu(packages={"torch": "2.13.0+cu130"}, attn="sdpa", capability=H100),
        {"device": "cpu", "capability": None}),
    "torch-cudnn-sdpa-b200-gqa": (
        gpu(packages={"torch": "2.12.0"}, attn="sdpa", capability=B200),
        {"capability": H100}),
    "accelerate-0.31.0-ga-fp16": (
        Situation(packages={"accelerate": "0.31.0"}, gradient_accumulation_steps=2, dtype="float16"),
        {"packages": {"accelerate": "0.30.1"}}),
    "deepspeed-zero2-gradients": (
        Situation(packages={"deepspeed": "0.18.2"}),
        {"packages": {"deepspeed": "0.17.5"}}),
    "bitsandbytes-0.41.0-qlora-flash-attention": (
        gpu(packages={"bitsandbytes": "0.41.0"}, quantization="4bit", attn="flash_attention_2", capability=A100),
        {"packages": {"bitsandbytes": "0.41.1"}}),
    "bitsandbytes-qlora-frozen-activations": (
        gpu(packages={"bitsandbytes": "0.43.1"}, quantization="4bit", adapter="lora", capability=A100),
        {"quantization": "none"}),
    "bitsandbytes-0.48.0-int8": (
        gpu(packages={"bitsandbytes": "0.48.0"}, quantization="8bit", capability=A100),
        {"quantization": "4bit"}),
    "trl-packing-cross-contamination": (
        Situation(packages={"trl": "0.19.0"}, trainer="trl", packing=True, attn="sdpa"),
        {"attn": "flash_attention_2"}),
    "peft-checkpointing-frozen-inputs": (
        Situation(packages={"peft": "0.3.0"}, adapter="lora", gradient_checkpointing=True),
        {"packages": {"peft": "0.4.0"}}),
    "peft-0.6.0-adapter-save": (
        Situation(packages={"peft": "0.6.0"}, adapter="lora"),
        {"adapter": "none"}),
    "tokenizers-0.19.0-llama3-merges": (
        Situation(packages={"tokenizers": "0.19.0"}, model_type="llama"),
        {"model_type": "mistral"}),
}
# rows that hinge on a setting no recipe states: they "may apply", never fail
MAY_APPLY = {"torch-cudnn-sdpa-b200-gqa", "deepspeed-zero2-gradients"}


def bug(bug_id: str):
    return next(b for b in known_bugs() if b.id == bug_id)


def test_the_table_has_twenty_rows_each_with_a_case_and_its_source():
    ids = [b.id for b in known_bugs()]
    assert len(ids) >= 20 and set(ids) == set(CASES)
    packages = {b.package for b in known_bugs()}
    assert {"torch", "transformers", "peft", "trl", "bitsandbytes", "flash-attn", "accelerate", "deepspeed",
            "tokenizers"} <= packages
    for row in known_bugs():
        assert row.link.startswith("https://github.com/") and row.title and row.what, row.id
        assert row.fixed or row.workaround, row.id


@pytest.mark.parametrize("bug_id", sorted(CASES))
def test_each_row_applies_where_it_should_and_not_elsewhere(bug_id):
    applies, change = CASES[bug_id]
    verdict = judge(bug(bug_id), applies)
    assert verdict.state == ("may_apply" if bug_id in MAY_APPLY else "applies"), verdict
    assert verdict.installed == next(iter(applies.packages.values()))
    assert judge(bug(bug_id), replace(applies, **change)).state == "no"
    # and never where the package is not installed
    assert judge(bug(bug_id), replace(applies, packages={})).state == "no"


def test_the_failure_line_names_version_fix_and_source():
    line = judge(bug("transformers-ga-loss-normalisation"), CASES["transformers-ga-loss-normalisation"][0]).line()
    assert line.startswith("transformers-ga-loss-normalisation: transformers 4.45.2")
    assert "Fix: upgrade to transformers>=4.46.0, or gradient_accumulation_steps = 1" in line
    assert "<https://github.com/huggingface/transformers/pull/34191>" in line


def test_a_recipe_that_names_no_trainer_is_assumed_to_use_one_and_says_so():
    situation = replace(CASES["transformers-ga-loss-normalisation"][0], trainer=None)
    verdict = judge(bug("transformers-ga-loss-normalisation"), situation)
    assert verdict.state == "applies"
    assert "assuming you train with the Hugging Face Trainer or TRL or Axolotl or LLaMA-Factory" in verdict.line()
    # a recipe read from a trainer the row does not name
    assert judge(bug("trl-packing-cross-contamination"),
                 replace(CASES["trl-packing-cross-contamination"][0], trainer="axolotl")).state == "no"


def test_facts_that_cannot_be_read_make_a_row_unknown_not_clean():
    gemma = replace(CASES["transformers-gemma2-sdpa-softcapping"][0], model_type=None)
    verdict = judge(bug("transformers-gemma2-sdpa-softcapping"), gemma)
    assert verdict.state == "unknown" and "model_type" in verdict.notes[0]
    assert needs_model_type(gemma)
    assert not needs_model_type(Situation(packages={"torch": "2.13.0", "tokenizers": "0.23.3"}))
    blind = replace(CASES["torch-2.5.0-cudnn-sdpa"][0], capability=None, gpu_unknown="no GPU here")
    assert judge(bug("torch-2.5.0-cudnn-sdpa"), blind).notes == ("the GPU's compute capability (no GPU here)",)
    odd = Situation(packages={"peft": "main-branch"}, gradient_checkpointing=True)
    assert judge(bug("peft-checkpointing-frozen-inputs"), odd).state == "unknown"


def test_pre_releases_and_local_builds_are_held_against_the_range():
    peft_checkpointing = CASES["transformers-peft-checkpointing-trainer"][0]
    assert judge(bug("transformers-peft-checkpointing-trainer"),
                 replace(peft_checkpointing, packages={"transformers": "5.0.0.dev0"})).state == "applies"
    assert judge(bug("transformers-peft-checkpointing-trainer"),
                 replace(peft_checkpointing, packages={"transformers": "5.0.0"})).state == "no"
    assert judge(bug("torch-2.5.0-cudnn-sdpa"),
                 replace(CASES["torch-2.5.0-cudnn-sdpa"][0], packages={"torch": "2.5.1+cu124"})).state == "no"


@pytest.mark.parametrize("row, expected", [
    ({"id": "x", "package": "torch"}, "[[bug]] #1 (x): missing affected, fixed, link, title, what, workaround"),
    ({**{k: "1" for k in ("id", "package", "what", "fixed", "workaround", "title")}, "affected": "newer than 2",
      "link": "https://x"}, "affected: 'newer than 2' is not a PEP 440 version specifier"),
    ({**{k: "1" for k in ("id", "package", "what", "fixed", "workaround", "title")}, "affected": "<2",
      "link": "https://x", "when": {"gpu": ["h100"]}}, "[bug.when]: unknown condition(s) gpu; expected adapters"),
    ({**{k: "1" for k in ("id", "package", "what", "fixed", "workaround", "title")}, "affected": "<2",
      "link": "see the forum"}, "link must be the https:// address"),
])
def test_a_malformed_row_is_refused_naming_file_row_and_key(row, expected):
    with pytest.raises(ValueError) as info:
        parse_bugs({"bug": [row]}, "bugs.toml")
    assert expected in str(info.value) and str(info.value).startswith("bugs.toml")


RECIPE = """
[model]
path = "model"
dtype = "{dtype}"
attn_implementation = "{attn}"
[data]
train = ["train.jsonl"]
[training]
gradient_accumulation_steps = {ga}
gradient_checkpointing = {gc}
[hardware]
device = "{device}"
"""


@pytest.fixture
def known_bugs_check(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text("{}\n")
    all_checks()

    def run(machine, check_id, model_type="llama", dtype="bfloat16", attn="sdpa", ga=1, gc="false", device="auto"):
        (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": model_type}))
        recipe = parse_recipe(RECIPE.format(dtype=dtype, attn=attn, ga=ga, gc=gc, device=device), tmp_path / "recipe.toml")
        state = RunState(artifacts_root=tmp_path / "arts", machine_factory=lambda: machine).recipe_state(recipe)
        ctx = CheckContext(state, REGISTRY[check_id])
        REGISTRY[check_id].body(ctx)
        return {m.name: m.value for m in ctx.measured}
    return run


def with_packages(machine, **versions):
    return replace(machine, packages=tuple((name.replace("_", "-"), v) for name, v in versions.items()))


def test_the_check_fails_on_a_described_h100_with_torch_2_5_0_and_passes_on_an_a100(known_bugs_check):
    h100 = with_packages(fakes.nvidia(), torch="2.5.0", transformers="4.46.3")
    message = fails(known_bugs_check, h100, "stack.known_bugs",
                    "1 of 20 known bugs apply to this recipe here: torch-2.5.0-cudnn-sdpa (torch 2.5.0)\n",
                    "- torch-2.5.0-cudnn-sdpa: torch 2.5.0: torch 2.5.0 picks the new cuDNN attention backend",
                    "https://github.com/pytorch/pytorch/issues/139298",
                    "\nFix: upgrade to torch>=2.5.1, or torch.backends.cuda.enable_cudnn_sdp(False)")
    assert "transformers-" not in message
    a100 = with_packages(fakes.nvidia(name="NVIDIA A100-SXM4-80GB", cc=(8, 0)), torch="2.5.0", transformers="4.46.3")
    measured = known_bugs_check(a100, "stack.known_bugs")
    assert measured["known_bugs_considered"] == 20 and measured["known_bugs_applying"] == "none"


def test_the_check_reads_the_model_type_and_the_recipe(known_bugs_check):
    machine = with_packages(fakes.cpu_only(), transformers="4.44.2", accelerate="0.31.0")
    fails(known_bugs_check, machine, "stack.known_bugs", "transformers-gemma2-sdpa-softcapping",
          'attn_implementation = "eager"', model_type="gemma2", device="cpu")
    known_bugs_check(machine, "stack.known_bugs", model_type="llama", device="cpu")
    text = fails(known_bugs_check, machine, "stack.known_bugs", "accelerate-0.31.0-ga-fp16", "transformers-ga-loss",
                 "assuming you train with", dtype="float16", ga=4, device="cpu")
    assert text.count("\n- ") == 2
    assert text.splitlines()[-1].startswith("Fix: upgrade to transformers>=4.46.0, or gradient_accumulation_steps = 1")


def test_the_report_and_the_ci_summary_show_the_failure_under_stack(known_bugs_check):
    machine = with_packages(fakes.cpu_only(), peft="0.3.0")
    reason = fails(known_bugs_check, machine, "stack.known_bugs", gc="true", device="cpu")
    run = RecipeRun(name="demo", checks=[CheckRow("stack.known_bugs", "stack", "failed", reason)])
    page = html_report(run)
    assert "<td>stack</td>" in page and "&nbsp;&nbsp;stack.known_bugs" in page
    assert "peft-checkpointing-frozen-inputs: peft 0.3.0" in page and "https://github.com/huggingface/peft/pull/404" in page
    summary = markdown([run])
    assert "**stack.known_bugs**: 1 of 20 known bugs apply to this recipe here: peft-checkpointing-frozen-inputs" in summary
    assert "  - Fix: upgrade to peft>=0.4.0, or gradient_checkpointing = false" in summary


def test_a_gpu_recipe_on_a_machine_without_one_is_skipped_naming_the_hook(known_bugs_check):
    machine = with_packages(fakes.cpu_only(), torch="2.5.0")
    with pytest.raises(Skip) as info:
        known_bugs_check(machine, "stack.known_bugs", device="cuda")
    assert "19 of 20 known bugs judged, none applies" in str(info.value)
    assert "torch-2.5.0-cudnn-sdpa needs the GPU's compute capability" in str(info.value)
    assert "pytest_ftready_machine" in str(info.value)


def test_rows_that_hinge_on_an_unstated_setting_pass_and_are_recorded(known_bugs_check):
    measured = known_bugs_check(with_packages(fakes.cpu_only(), deepspeed="0.18.2"), "stack.known_bugs", device="cpu")
    assert measured["known_bugs_applying"] == "none"
    assert measured["known_bugs_may_apply"].startswith("deepspeed-zero2-gradients: deepspeed 0.18.2 "
                                                       "(if you train with DeepSpeed ZeRO stage 2)")
