"""A trainer's own run beside pytest-ftready's engine, as one table per config: step peak, tokens
per step, step time, overfit steps and final loss, resume, forecast error. Read from the JUnit XML
of ``pytest --ftready=CONFIG`` (the properties ``pipeline``, ``step_trainer``, ``peak_*``,
``step_*``, ``overfit_*``, ``engine_*``, ``resume_*``, ``forecast_error``, ``forecast_path``), so it is the same
table for a TRL, Axolotl or LLaMA-Factory config, each run in the trainer's own environment:

    python -m tests.benchmarks.trainer_table run CONFIG [CONFIG ...] [--out DIR] [--json FILE]
    python -m tests.benchmarks.trainer_table table RUN.xml [RUN.xml ...] [--json FILE]
    python -m tests.benchmarks.trainer_table smollm2 MODEL_DIR FOLDER [--rows N]

``run`` runs the model checks of each config with this interpreter (``python -m pytest``: the
trainer installed beside it is the one run) and prints the table; ``table`` prints it from JUnit
files already written; ``smollm2`` writes the 135M-class TRL config (LoRA r8, micro-batch 2,
max_length 128, float32, generated chat rows) over a SmolLM2-135M-Instruct model folder.
Run from the repository root with ``PYTHONPATH=$PWD``. Standard library only."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

CHECKS = ("model.step_memory", "model.overfit", "lifecycle.resume", "model.forecast_error")
SELECT = " or ".join(CHECKS)
PEAKS = ("peak_device_reserved[bytes]", "peak_tensor_bytes[bytes]")  # the step peak: allocator where there is one


@dataclass(frozen=True)
class Figures:
    """One config's figures; None where the run did not record one (a check skipped or failed early)."""

    config: str
    pipeline: Optional[str]
    step_trainer: Optional[str]
    step_peak_bytes: Optional[int]
    engine_step_peak_bytes: Optional[int]
    step_tokens: Optional[int]
    engine_step_tokens: Optional[int]
    step_seconds: Optional[float]
    engine_step_seconds: Optional[float]
    overfit_steps: Optional[int]
    engine_overfit_steps: Optional[int]
    overfit_final_loss: Optional[float]
    engine_overfit_final_loss: Optional[float]
    resume: str  # passed | failed | skipped | not run, with the largest loss difference
    forecast_error: Optional[float]  # the forecast of the trainer's step against it
    forecast_path: Optional[str]  # the step the forecast traced (model.forecast_error's forecast_path)
    outcomes: dict  # check -> passed | failed | skipped

    @property
    def own_step(self) -> bool:
        """The trainer ran its own step (the engine's figures are then recorded beside it)."""
        return self.engine_step_peak_bytes is not None


def _number(value: Optional[str]):
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return float(value)


def _cases(junit: Path) -> dict[str, dict[str, dict]]:
    """recipe (the test case's classname) -> check -> {"outcome": ..., property: value}."""
    found: dict[str, dict[str, dict]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        check = case.get("name", "").split("/")[-1].split("[")[0]
        if check not in CHECKS:
            continue
        kids = {child.tag for child in case}
        outcome = "failed" if kids & {"failure", "error"} else "skipped" if "skipped" in kids else "passed"
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        found.setdefault(case.get("classname") or junit.stem, {})[check] = {"outcome": outcome, **props}
    return found


def figures(junit: Path) -> list[Figures]:
    """The figures of every config a JUnit file holds."""
    out = []
    cases = _cases(junit)
    for recipe, checks in cases.items():
        config = junit.stem if len(cases) == 1 else recipe
        step, overfit = checks.get("model.step_memory", {}), checks.get("model.overfit", {})
        resume, forecast = checks.get("lifecycle.resume", {}), checks.get("model.forecast_error", {})
        names = next((c for c in (step, overfit, resume, forecast) if "step_trainer" in c), {})
        difference = resume.get("resume_max_loss_difference[nats]")
        out.append(Figures(
            config=config, pipeline=names.get("pipeline"), step_trainer=names.get("step_trainer"),
            step_peak_bytes=_number(next((step[k] for k in PEAKS if k in step), None)),
            engine_step_peak_bytes=_number(step.get("engine_peak_bytes[bytes]")),
            step_tokens=_number(step.get("step_tokens[tokens]")),
            engine_step_tokens=_number(step.get("engine_step_tokens[tokens]")),
            step_seconds=_number(step.get("step_seconds[s]")),
            engine_step_seconds=_number(step.get("engine_step_seconds[s]")),
            overfit_steps=_number(overfit.get("overfit_steps[steps]")),
            engine_overfit_steps=_number(overfit.get("engine_overfit_steps[steps]")),
            overfit_final_loss=_number(overfit.get("overfit_final_loss[nats]")),
            engine_overfit_final_loss=_number(overfit.get("engine_overfit_final_loss[nats]")),
            resume=(resume.get("outcome", "not run") + (f" (max loss difference {difference})" if difference else "")),
            forecast_error=_number(forecast.get("forecast_error[share]")),
            forecast_path=forecast.get("forecast_path"),
            outcomes={check: c["outcome"] for check, c in checks.items()}))
    return out


def _mb(value) -> str:
    return "-" if value is None else f"{value / 1e6:.2f} MB"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: Sequence[Figures]) -> str:
    """A Markdown table: the trainer's figure, then the engine's beside it ("=" where the engine is the trainer)."""
    head = ("config", "pipeline", "step trainer", "step peak", "engine step peak", "peak / engine", "tokens/step",
            "engine tokens/step", "step s", "engine step s", "overfit steps", "engine overfit steps",
            "overfit final loss", "engine overfit final loss", "resume", "forecast error", "forecast path",
            "not passed")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in rows:
        same = "=" if not f.own_step else None
        ratio = (f"{f.step_peak_bytes / f.engine_step_peak_bytes:.2f}x"
                 if f.own_step and f.step_peak_bytes else same or "-")
        cells = (f.config, f.pipeline or "-", f.step_trainer or "-", _mb(f.step_peak_bytes),
                 same or _mb(f.engine_step_peak_bytes), ratio, _fmt(f.step_tokens, "d"),
                 same or _fmt(f.engine_step_tokens, "d"), _fmt(f.step_seconds, ".3f"),
                 same or _fmt(f.engine_step_seconds, ".3f"), _fmt(f.overfit_steps, "d"),
                 same or _fmt(f.engine_overfit_steps, "d"), _fmt(f.overfit_final_loss, ".4f"),
                 same or _fmt(f.engine_overfit_final_loss, ".4f"), f.resume, _fmt(f.forecast_error, "+.1%"),
                 f.forecast_path or "-",
                 ", ".join(f"{check} {outcome}" for check, outcome in sorted(f.outcomes.items()) if outcome != "passed")
                 or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_checks(config: Path, out: Path, extra: Sequence[str] = ()) -> Path:
    """The model checks of ``config`` in a fresh pytest process of this interpreter; its JUnit file."""
    config = config.resolve()
    junit = out.resolve() / f"{config.parent.name}-{config.stem}.xml"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS",
                 "HF_DATASETS_DISABLE_PROGRESS_BARS"):
        env.setdefault(name, "1")
    command = [sys.executable, "-m", "pytest", f"--ftready={config}", "-k", SELECT, f"--junitxml={junit}",
               "-p", "no:cacheprovider", "-q", *extra]
    done = subprocess.run(command, cwd=config.parent, env=env, capture_output=True, text=True)
    if not junit.exists():
        raise SystemExit(f"pytest wrote no JUnit file for {config} (exit {done.returncode}):\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return junit


SMOLLM2_TEMPLATE = (  # SmolLM2-135M-Instruct's own template with {% generation %} around the assistant turns
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def smollm2_config(model_dir: Path, folder: Path, rows: int = 100) -> Path:
    """A TRL config on SmolLM2-135M (LoRA r8 on q/v, micro-batch 2, max_length 128, float32
    without autocast) over ``rows`` generated chats, with its ftready.toml beside it."""
    from pytest_ftready.tiny import example_rows, write_jsonl

    write_jsonl(folder / "data" / "train.jsonl", example_rows(rows))
    (folder / "smollm2.jinja").write_text(SMOLLM2_TEMPLATE)
    (folder / "ftready.toml").write_text('''[model]
license = "apache-2.0"
[data]
rights = "generated by pytest_ftready.tiny"
[checks]
overfit_examples = 4
overfit_steps = 60
overfit_loss = 0.3
''')
    config = folder / "trl-sft.yaml"
    config.write_text(f"""model_name_or_path: {model_dir.resolve()}
dtype: float32
bf16: false
attn_implementation: sdpa
chat_template_path: {(folder / "smollm2.jinja").resolve()}
use_peft: true
lora_r: 8
lora_alpha: 32
lora_dropout: 0.0
lora_target_modules: [q_proj, v_proj]
datasets:
  - path: json
    data_files: data/train.jsonl
assistant_only_loss: true
max_length: 128
packing: false
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
learning_rate: 5.0e-3
num_train_epochs: 1
gradient_checkpointing: false
seed: 42
output_dir: runs/trl
report_to: none
""")
    return config


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.trainer_table",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the model checks of each config, then print the table")
    run.add_argument("configs", nargs="+", type=Path)
    run.add_argument("--out", type=Path, default=Path(".ftready") / "trainer-table",
                     help="folder for the JUnit files")
    run.add_argument("--json", type=Path, help="also write the figures as JSON (for a dashboard)")
    shown = sub.add_parser("table", help="print the table of JUnit files already written")
    shown.add_argument("junit", nargs="+", type=Path)
    shown.add_argument("--json", type=Path)
    smol = sub.add_parser("smollm2", help="write the 135M-class TRL config over a SmolLM2-135M model folder")
    smol.add_argument("model_dir", type=Path)
    smol.add_argument("folder", type=Path)
    smol.add_argument("--rows", type=int, default=100)
    args = parser.parse_args(argv)
    if args.command == "smollm2":
        print(smollm2_config(args.model_dir, args.folder, args.rows))
        return 0
    if args.command == "run":
        args.out.mkdir(parents=True, exist_ok=True)
        files = [run_checks(config, args.out) for config in args.configs]
    else:
        files = args.junit
    rows = [f for junit in files for f in figures(junit)]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
