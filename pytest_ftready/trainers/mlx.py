"""mlx-lm as a trainer: Apple's MLX, run for real wherever ``mlx`` imports (on this Linux CI its
CPU backend, ``pip install "mlx[cpu]" "mlx-lm[cpu]"``; on a Mac its Metal backend).

- ``pipeline``: each row through mlx-lm's own dataset classes (``mlx_lm.tuner.datasets.
  create_dataset``: ChatDataset, CompletionsDataset, TextDataset, chosen by the first row's keys
  as mlx-lm chooses them), with mlx-lm's tokenizer; their ``(tokens, offset)`` become labels
  (every token from ``offset`` on is trained, cut at ``max_seq_length`` as mlx-lm's batches cut
  it), judged by ``data.masking`` like any trainer's.
- ``step``: mlx-lm's own ``tuner.trainer.train`` for one iteration on the worst-case batch (the
  longest rows, padded as mlx-lm pads them), its adapters built by ``linear_to_lora_layers`` as
  ``mlx_lm lora`` builds them; the peak is ``mx.get_peak_memory()`` (what MLX has allocated at
  its highest: weights, adapters, gradients, optimizer state, activations; not its buffer cache),
  judged against the memory MLX may use (``mlx_capacity``) less ``memory_headroom``, with MLX's
  own levers named where it does not fit.
- ``overfit``: the same ``train`` on the first ``overfit_examples`` rows until the loss target,
  then mlx-lm's greedy ``generate_step`` on the first row's prompt.
- save and resume: a straight run with mlx-lm's checkpoint at half (``NNNNNNN_adapters.
  safetensors``), resumed in a fresh process through ``resume_adapter_file``. mlx-lm restores
  the adapter weights only: not the optimizer state, not the iteration count nor the schedule
  (they restart at 0), not the data order (the batches restart from the seed's first
  permutation). Where those matter the resumed losses differ and the check fails saying so.
- ``reloaded_outputs`` (``lifecycle.generate``): the saved adapters loaded on a fresh base, and
  the model ``mlx_lm fuse`` writes, each generating greedily, against the in-memory model.

The model is loaded by mlx-lm (``mlx_lm.utils.load``), never by torch. Imports mlx only when a
run starts."""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from ..outcomes import Fail, Skip
from .base import (FunctionPipeline, Pipeline, PipelineInputs, Reloaded, ResumeRequest, RunInputs, RunRows, SavedRun,
                   StepLog, Trainer, reloaded, worst_case_examples)

STEP_TRAINER = "mlx-lm tuner.trainer"
INSTALL = 'pip install "mlx[cpu]" "mlx-lm[cpu]" (Linux: MLX\'s CPU backend) or pip install mlx-lm (a Mac)'
FEATURES = ("prompt_feature", "completion_feature", "chat_feature", "text_feature")
CHECKPOINT = "{:07d}_adapters.safetensors"  # mlx-lm's numbered save (tuner/trainer.py)
RESTORED = ("mlx-lm's resume_adapter_file restores the adapter weights only: the optimizer state starts empty, the "
            "iteration count and the learning-rate schedule restart at 0, and the batches restart from the seed's "
            "first permutation")


def mlx_missing() -> str:
    """"" where mlx (its Python bindings) and mlx-lm import here, else what to install."""
    import importlib.util

    from ..machine.devices import mlx_cpu_backend

    if not mlx_cpu_backend():
        return f"mlx is not installed in this environment ({INSTALL})"
    if importlib.util.find_spec("mlx_lm") is None:
        return f"mlx-lm is not installed in this environment ({INSTALL})"
    return ""


def mlx_capacity(device) -> tuple[Optional[int], str]:
    """(bytes MLX may use, where that figure comes from): on a Mac the GPU's recommended working
    set (the wired limit mlx-lm sets itself to), elsewhere the host's RAM (MLX's CPU backend
    allocates ordinary memory)."""
    import mlx.core as mx

    if mx.metal.is_available():
        info = mx.device_info()
        limit = info.get("max_recommended_working_set_size") or info.get("memory_size")
        if limit:
            return int(limit), "the Metal device's max_recommended_working_set_size (macOS keeps the rest)"
    return device.memory_total_bytes, "the host's RAM (MLX's CPU backend)"


def mlx_config(recipe) -> dict:
    """The mlx-lm config a run is handed: mlx-lm's CONFIG_DEFAULTS, the team's config over them
    (an mlx-lm recipe), else the recipe's own adapter and training keys in mlx-lm's names."""
    from mlx_lm.lora import CONFIG_DEFAULTS

    config = json.loads(json.dumps(CONFIG_DEFAULTS))
    origin = recipe.origin
    if origin is not None and origin.format == "mlx":
        config.update({k: floats(v) for k, v in origin.handed().items() if v is not None})
    else:
        a, t = recipe.adapter, recipe.training
        config.update(fine_tune_type="lora" if a.method == "lora" else "full", num_layers=-1,
                      batch_size=t.micro_batch_size, learning_rate=t.learning_rate,
                      optimizer="adamw" if t.optimizer.startswith("adamw") else t.optimizer,
                      grad_checkpoint=t.gradient_checkpointing, seed=t.seed, max_seq_length=recipe.data.max_length,
                      lora_parameters={"rank": a.r, "scale": a.alpha / a.r, "dropout": a.dropout},
                      mask_prompt=recipe.data.train_on != "all",
                      grad_accumulation_steps=t.gradient_accumulation_steps)
    config["model"] = str(recipe.model.path) if recipe.model.path else recipe.model.id
    return config


# mlx-lm's YAML loader reads 1e-5 as a float (its implicit resolver in lora.py); plain YAML 1.1 reads text
EXPONENT = re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$")


def floats(value: Any) -> Any:
    """``value`` as mlx-lm's loader reads it: exponent-written numbers (in lists and mappings too) as floats."""
    if isinstance(value, str) and EXPONENT.match(value):
        return float(value)
    if isinstance(value, list):
        return [floats(v) for v in value]
    if isinstance(value, dict):
        return {k: floats(v) for k, v in value.items()}
    return value


def model_source(recipe) -> str:
    if recipe.model.path:
        return str(recipe.model.path)
    raise Skip(f"the MLX run loads a local model folder; {recipe.model.id!r} is a hub id: set [model] path to a local "
               "copy (mlx_lm.convert writes one)")


def load(recipe, source: Optional[str] = None, **kwargs):
    """(model, tokenizer) as mlx-lm loads them (``mlx_lm.utils.load``); a Fail with mlx-lm's own
    message where it cannot (an architecture it lacks, weights that do not fit the class)."""
    from mlx_lm.utils import load as mlx_load

    source = source or model_source(recipe)
    try:
        with quiet():
            return mlx_load(source, tokenizer_config={"trust_remote_code": recipe.model.trust_remote_code}, **kwargs)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        said = " ".join(str(exc).split())
        raise Fail(f"mlx-lm cannot load {source}: {type(exc).__name__}: {said[:400]}") from None


def loaded(recipe) -> dict:
    """``stack.mlx`` on this machine: the model loaded by mlx-lm (its class for the architecture,
    the weights into it, strictly), its tokenizer, and the chat template where the rows are
    chats; what was loaded, as measurements."""
    from ..recipe.schema import CHAT_FORMATS

    model, tokenizer = load(recipe)
    config = json.loads((Path(model_source(recipe)) / "config.json").read_text(encoding="utf-8"))
    if recipe.data.format in CHAT_FORMATS + ("prompt_completion",) and not tokenizer.chat_template:
        raise Fail(f"the tokenizer mlx-lm loads from {model_source(recipe)} has no chat template: mlx-lm's "
                   "ChatDataset and CompletionsDataset render every row with it; add one (chat_template.jinja)")
    return {"mlx_model_class": f"{type(model).__module__}.{type(model).__name__}",
            "mlx_parameters": sum(int(v.size) for _, v in _flat(model.parameters())),
            "mlx_blocks": len(model.layers), "mlx_quantized_bits": (config.get("quantization") or {}).get("bits", 0)}


def _flat(tree) -> list:
    from mlx.utils import tree_flatten

    return tree_flatten(tree)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """mlx-lm prints its progress (rich) on stdout: kept off the terminal and the worker's JSON."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class MlxPipeline(FunctionPipeline):
    """Each row through mlx-lm's dataset class for the data (chosen by the first row's keys)."""

    def __init__(self, inputs: PipelineInputs) -> None:
        from mlx_lm.utils import load_tokenizer

        recipe = inputs.recipe
        config = mlx_config(recipe)
        self.namespace = types.SimpleNamespace(mask_prompt=bool(config.get("mask_prompt")),
                                               **{k: config[k] for k in FEATURES if k in config})
        self.max_length = int(config.get("max_seq_length") or recipe.data.max_length)
        with quiet():
            self.mlx_tokenizer = load_tokenizer(Path(model_source(recipe)))
        self.dataset: Any = None
        super().__init__(self.labelled, recipe, inputs.tokenizer, inputs.stop_ids, name="mlx")
        self.method = "mlx-lm " + ("mask_prompt" if self.namespace.mask_prompt else "every token")

    def labelled(self, row: dict) -> dict:
        from mlx_lm.tuner.datasets import create_dataset

        if self.dataset is None:  # mlx-lm picks one class for a file from its first row
            self.dataset = create_dataset([row], self.mlx_tokenizer, self.namespace)
            masked = " mask_prompt" if self.namespace.mask_prompt else ""
            self.method = f"mlx-lm {type(self.dataset).__name__}{masked}"
        tokens, offset = self.dataset.process(row)
        tokens = list(tokens)[: self.max_length]
        return {"input_ids": tokens, "labels": [t if i >= offset else -100 for i, t in enumerate(tokens)]}


# ---- mlx-lm's own run ---------------------------------------------------------------------------
@dataclass
class Run:
    """One run of mlx-lm's tuner: its model with adapters, optimizer and what the run logged."""

    model: Any
    tokenizer: Any
    optimizer: Any
    args: types.SimpleNamespace
    losses: list
    peak_bytes: int = 0
    seconds: list = field(default_factory=list)  # each iteration's, as mlx-lm reports it


class Stop(Exception):
    """Raised by the report callback to end a run at its target."""


def prepared(recipe, overrides: Optional[dict] = None) -> Run:
    """The model mlx-lm's ``train_model`` prepares (frozen base, LoRA/DoRA layers on the last
    num_layers blocks, or the last blocks unfrozen for full), its optimizer as ``mlx_lm lora``
    builds it, and the args."""
    import mlx.core as mx
    import mlx.optimizers as optim
    import numpy as np
    from mlx_lm.tuner.utils import build_schedule, linear_to_lora_layers

    args = types.SimpleNamespace(**{**mlx_config(recipe), **(overrides or {})})
    model, tokenizer = load(recipe)
    np.random.seed(args.seed)  # mlx_lm lora's run(): the data order
    mx.random.seed(args.seed)
    model.freeze()
    if args.num_layers > len(model.layers):
        raise Fail(f"num_layers {args.num_layers} but the model has {len(model.layers)} blocks: mlx-lm stops with "
                   f"'Requested to train {args.num_layers} layers'; set num_layers: {len(model.layers)} or -1")
    if args.fine_tune_type == "full":
        for layer in model.layers[-max(args.num_layers, 0):]:
            layer.unfreeze()
    else:
        linear_to_lora_layers(model, args.num_layers, args.lora_parameters, use_dora=args.fine_tune_type == "dora")
    if getattr(args, "resume_adapter_file", None):
        model.load_weights(args.resume_adapter_file, strict=False)
    lr = build_schedule(args.lr_schedule) if args.lr_schedule else args.learning_rate
    classes = {"adam": optim.Adam, "adamw": optim.AdamW, "muon": optim.Muon, "sgd": optim.SGD,
               "adafactor": optim.Adafactor}
    name = str(args.optimizer).lower()
    optimizer = classes[name](learning_rate=lr, **(args.optimizer_config or {}).get(name, {}))
    return Run(model, tokenizer, optimizer, args, [])


def rows_dataset(run: Run, rows: Sequence[dict]):
    from mlx_lm.tuner.datasets import CacheDataset, create_dataset

    return CacheDataset(create_dataset(list(rows), run.tokenizer, run.args))


def train(run: Run, rows: Sequence[dict], iters: int, adapter_folder: Path, save_every: Optional[int] = None,
          target: Optional[float] = None) -> Run:
    """mlx-lm's ``tuner.trainer.train`` over ``rows`` for ``iters`` iterations (every loss reported;
    stopped once it reaches ``target``), saving as mlx-lm saves (``adapters.safetensors`` and a
    numbered file every ``save_every``). Its gradient checkpointing patches the block class's
    ``__call__``: put back afterwards, so later runs in this process are not checkpointed."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.trainer import TrainingArgs
    from mlx_lm.tuner.trainer import train as mlx_train
    from mlx_lm.utils import save_config

    class Report(TrainingCallback):
        def on_train_loss_report(self, info: dict) -> None:
            run.losses.append(float(info["train_loss"]))
            run.seconds.append(1.0 / info["iterations_per_second"] if info["iterations_per_second"] else 0.0)
            if target is not None and len(run.losses) >= 2 and run.losses[-1] <= target:
                raise Stop

    adapter_folder.mkdir(parents=True, exist_ok=True)
    save_config({**vars(run.args), "adapter_path": str(adapter_folder)}, adapter_folder / "adapter_config.json")
    a = run.args
    training = TrainingArgs(batch_size=min(a.batch_size, len(rows)), iters=iters, steps_per_report=1,
                            steps_per_eval=iters + 1, steps_per_save=save_every or iters + 1,
                            adapter_file=str(adapter_folder / "adapters.safetensors"), max_seq_length=a.max_seq_length,
                            grad_checkpoint=a.grad_checkpoint, grad_accumulation_steps=a.grad_accumulation_steps)
    block = type(run.model.layers[0])
    call = block.__call__
    mx.reset_peak_memory()
    try:
        with quiet():
            mlx_train(model=run.model, optimizer=run.optimizer, train_dataset=rows_dataset(run, rows),
                      args=training, training_callback=Report())
    except Stop:
        mx.save_safetensors(training.adapter_file, dict(tree_flatten(run.model.trainable_parameters())))
    finally:
        block.__call__ = call
    run.peak_bytes = int(mx.get_peak_memory())
    return run


def nbytes(tree) -> int:
    return sum(int(v.nbytes) for _, v in _flat(tree) if hasattr(v, "nbytes"))


def levers(recipe, args) -> list[str]:
    """What lowers an MLX step's peak, in mlx-lm's keys."""
    out = [f"batch_size {args.batch_size} -> {max(1, args.batch_size // 2)} (grad_accumulation_steps x2 keeps the "
           "effective batch)" if args.batch_size > 1 else "",
           f"max_seq_length {args.max_seq_length} -> {args.max_seq_length // 2} (activations scale with it)",
           "" if args.grad_checkpoint else "grad_checkpoint: true (recomputes each block's activations)",
           f"num_layers {args.num_layers} -> {max(1, args.num_layers // 2) if args.num_layers > 1 else 8} "
           "(adapters, their gradients and kept activations on fewer blocks)" if args.fine_tune_type != "full"
           or args.num_layers != 1 else "",
           "a 4-bit base: mlx_lm.convert --hf-path MODEL -q --q-bits 4 (QLoRA; the weights shrink about 4x)"
           if recipe.model.quantization == "none" else ""]
    return [f"- {line}" for line in out if line]


def greedy(model, prompt: Sequence[int], stops: frozenset, max_tokens: int) -> list[int]:
    """mlx-lm's ``generate_step`` with its argmax sampler, up to a stop token."""
    import importlib

    import mlx.core as mx

    generate_step = importlib.import_module("mlx_lm.generate").generate_step
    out: list[int] = []
    for token, _ in generate_step(mx.array(list(prompt)), model, max_tokens=max_tokens):
        out.append(int(token))
        if int(token) in stops:
            break
    return out


class MlxTrainer(Trainer):
    name = "mlx"
    step_trainer = STEP_TRAINER
    label = "mlx-lm"
    module = "mlx_lm"
    install = INSTALL

    def missing(self) -> str:
        return mlx_missing()

    def _ready(self) -> None:
        missing = mlx_missing()
        if missing:
            raise Skip(f"the recipe trains with mlx-lm but {missing}")

    def pipeline(self, inputs: PipelineInputs) -> Pipeline:
        self._ready()
        return MlxPipeline(inputs)

    def step(self, inputs: RunInputs):
        """mlx-lm's own iteration on the worst-case batch, its peak as MLX counts it."""
        from ..engine.breakdown import Breakdown
        from ..engine.memory import _HostPeak
        from ..engine.step import StepMeasurement

        self._ready()
        recipe = inputs.recipe
        rows = [e.row.data for e in worst_case_examples(inputs)]
        host = _HostPeak()  # the process's own high-water mark across the step
        run = prepared(recipe, {"batch_size": len(rows)})
        weights = nbytes(run.model.parameters())
        trainable = nbytes(run.model.trainable_parameters())
        train(run, rows, 2, inputs.scratch / "mlx-step")  # the first compiles the step (MLX's JIT): the second is timed
        host_bytes, host_method = host.finish()
        capacity, where = mlx_capacity(inputs.device)
        usable = int(capacity * (1 - recipe.hardware.memory_headroom)) if capacity else None
        over = ""
        if capacity is not None and usable is not None and run.peak_bytes > usable:
            from ..units import human_bytes

            over = (f"mlx-lm's step peaks at {human_bytes(run.peak_bytes)} (mx.get_peak_memory) but MLX may use "
                    f"{human_bytes(usable)} here ({human_bytes(capacity)}, {where}, less the "
                    f"{recipe.hardware.memory_headroom:.0%} memory_headroom); on a Mac the run would swap or be "
                    "killed. MLX levers (mlx-lm's keys):\n" + "\n".join(levers(recipe, run.args)))
        tokens = sum(min(len(e.input_ids), run.args.max_seq_length) for e in worst_case_examples(inputs))
        optimizer_state = nbytes(run.optimizer.state)
        return StepMeasurement(run.peak_bytes, capacity, host_bytes, host_method, tokens, run.seconds[-1],
                               Breakdown(weights, weights - trainable, trainable, trainable, optimizer_state,
                                         run.peak_bytes),
                               len(run.model.layers), out_of_memory=over, vocab_size=0, trainer=self.step_trainer)

    def overfit(self, inputs: RunInputs):
        """mlx-lm's own run on the first ``overfit_examples`` rows until the loss target, then its greedy generation."""
        from ..engine.overfit import OverfitResult, target_reached

        self._ready()
        recipe, c = inputs.recipe, inputs.recipe.checks
        examples = list(inputs.examples[: c.overfit_examples])
        run = prepared(recipe)
        folder = inputs.scratch / "mlx-overfit"
        inputs.progress(f"model.overfit: mlx-lm on {len(examples)} rows, up to {c.overfit_steps} iterations", True)
        train(run, [e.row.data for e in examples], c.overfit_steps, folder, target=c.overfit_loss)
        first = examples[0]
        prompt = inputs.encoder().prompt_ids(first.row)
        with quiet():
            ids = greedy(run.model, prompt, inputs.stop_ids, c.max_new_tokens)
        return OverfitResult(run.losses, target_reached(run.losses, c.overfit_loss), folder, list(prompt), ids,
                             first.row.where, c.overfit_loss, float(run.args.learning_rate), trainer=self.step_trainer)

    def forecast(self, inputs: RunInputs):
        """``model.forecast_error``: the step forecast from config.json (``forecast.mlx``) for the
        worst-case batch ``step`` runs (None where config.json is not readable)."""
        from ..forecast.mlx import forecast_folder

        examples = worst_case_examples(inputs)
        args = mlx_config(inputs.recipe)
        return forecast_folder(Path(model_source(inputs.recipe)), args, len(examples),
                               max(len(e.input_ids) for e in examples))

    def reloaded_outputs(self, inputs: RunInputs, result) -> list[Reloaded]:
        """``lifecycle.generate``: the saved adapters on a freshly loaded base (mlx-lm's
        ``load(adapter_path=...)``) and the model ``mlx_lm fuse`` writes, each generating greedily
        (never torch's reload: mlx-lm saves and fuses its own way)."""
        recipe = inputs.recipe
        fused = Path(result.adapter_dir).parent / "mlx-fused"
        fuse(model_source(recipe), result.adapter_dir, fused)
        out = {}
        for name, source, kwargs in (("adapter", None, {"adapter_path": str(result.adapter_dir)}),
                                     ("merged", str(fused), {})):
            model, _ = load(recipe, source, **kwargs)
            with quiet():
                out[name] = greedy(model, result.prompt_ids, inputs.stop_ids, recipe.checks.max_new_tokens)
        return reloaded(out)

    def export(self, recipe, result, folder: Path) -> dict:
        """``lifecycle.mlx_export`` (``run_export``)."""
        self._ready()
        return run_export(recipe, result, folder)

    # ---- save and resume -----------------------------------------------------------------
    def saved_run(self, inputs: RunInputs) -> SavedRun:
        """The straight run of K iterations, mlx-lm saving its adapters at K/2."""
        self._ready()
        steps, examples = self.straight_run(inputs)
        rows = RunRows.of(inputs.scratch / "mlx-resume", examples)
        run = train(prepared(inputs.recipe), rows.rows, steps, rows.folder / "adapters", save_every=steps // 2)
        checkpoint = rows.folder / "adapters" / CHECKPOINT.format(steps // 2)
        if not checkpoint.is_file():
            raise Fail(f"mlx-lm saved no {checkpoint.name} at iteration {steps // 2}")
        logs = tuple(StepLog(i, loss) for i, loss in enumerate(run.losses, start=1))
        return SavedRun(rows.folder, checkpoint, steps, logs, checkpoint.stat().st_size, exact=True)

    def resume_files(self, checkpoint: Path) -> list[str]:
        return [Path(checkpoint).name]

    def resume_here(self, request: ResumeRequest, recipe) -> list[StepLog]:
        """In the fresh process: ``mlx_lm lora --resume-adapter-file`` over the same rows for the
        remaining iterations, as a team would resume."""
        self._ready()
        rows = RunRows.resumed(Path(request.folder))
        half = request.steps // 2
        run = prepared(recipe, {"resume_adapter_file": request.checkpoint})
        train(run, rows.rows, request.steps - half, rows.folder / "adapters")
        return [StepLog(half + i, loss) for i, loss in enumerate(run.losses, start=1)]

    def difference(self, saved: SavedRun, resumed: Sequence[StepLog]) -> str:
        from ..engine.checkpoint import compare_losses

        straight, again = saved.straight_losses[saved.steps // 2:], [log.loss for log in resumed]
        said = compare_losses(straight, again, saved.exact)
        if not said or len(straight) != len(again):
            return said
        step, (a, b) = next((saved.steps // 2 + i, pair) for i, pair in enumerate(zip(again, straight), start=1)
                            if pair[0] != pair[1])
        return (f"step {step} after the resume: loss {a:.6f}, uninterrupted {b:.6f} (difference {abs(a - b):.3g}); "
                f"{RESTORED}. No file of mlx-lm's holds them: a resumed run is a new run from the saved adapters (plan "
                "its warm-up and schedule as such), or keep runs short enough not to need one")


def fuse(model: str, adapters: Path, save_path: Path, *extra: str) -> None:
    """``mlx_lm fuse`` as a team runs it, in a fresh interpreter; a Fail with its last error line."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "mlx_lm", "fuse", "--model", model, "--adapter-path", str(adapters),
                           "--save-path", str(save_path), *extra], check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Fail(f"mlx_lm fuse {' '.join(extra)} failed: {last}")


GGUF_TYPES = ("llama", "mistral", "mixtral")  # mlx_lm/fuse.py: the types --export-gguf converts


def export_refusal(recipe) -> str:
    """Why ``mlx_lm fuse`` cannot write the export the recipe declares, read from the model's
    config.json before anything runs (no mlx needed): GGUF of a model type mlx-lm does not
    convert, GGUF of a quantized base (with the command that works); "" where it can."""
    if recipe.export.format != "gguf":
        return ""
    source = model_source(recipe)
    try:
        config = json.loads((Path(source) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""  # stack.mlx names an unreadable model
    model_type, bits = config.get("model_type"), (config.get("quantization") or {}).get("bits")
    if model_type not in GGUF_TYPES:
        return (f"mlx_lm fuse --export-gguf converts {', '.join(GGUF_TYPES)} only, not {model_type!r} (it stops with "
                f"'Model type {model_type} not supported for GGUF conversion'): export safetensors ([export] format = "
                "\"safetensors\") and convert the fused folder with llama.cpp's convert_hf_to_gguf.py")
    if bits:
        return (f"the base is quantized ({bits}-bit, config.json quantization): mlx_lm fuse --export-gguf cannot write "
                f"it (GGUF conversion of quantized models is not implemented in mlx-lm); run mlx_lm fuse --model "
                f"{source} --adapter-path ADAPTERS --dequantize --export-gguf (the fused model in 16 bits)")
    return ""


def run_export(recipe, result, folder: Path) -> dict:
    """``lifecycle.mlx_export``: the export the recipe declares, run as ``mlx_lm fuse`` runs it
    (``export_refusal`` first). safetensors: the fused model's logits on the overfit prompt
    against base + adapters; gguf: also written with ``--export-gguf``, read back (``mx.load``)
    and held against the fused weights. What was exported, as measurements."""
    import mlx.core as mx

    refusal = export_refusal(recipe)
    if refusal:
        raise Fail(refusal)
    source = model_source(recipe)
    adapters = Path(result.adapter_dir)
    fused = folder / "mlx-export"
    fuse(source, adapters, fused, *(("--export-gguf",) if recipe.export.format == "gguf" else ()))
    base, _ = load(recipe, None, adapter_path=str(adapters))
    model, _ = load(recipe, str(fused))
    prompt = mx.array([list(result.prompt_ids)])
    difference = float(mx.abs(base(prompt) - model(prompt)).max())
    out = {"export_logit_difference": difference, "export_bytes": sum(f.stat().st_size for f in fused.iterdir())}
    if difference > 1e-3:
        raise Fail(f"the fused model's logits differ from base + adapters by up to {difference:.3g} on "
                   f"{result.example_where}'s prompt: mlx_lm fuse did not write the trained model")
    if recipe.export.format == "gguf":
        out.update(read_back(fused / "ggml-model-f16.gguf", dict(_flat(model.parameters()))))
    return out


def read_back(path: Path, weights: dict) -> dict:
    """The GGUF file read back by MLX: its architecture, every fused weight under its GGUF name
    (mlx-lm's ``translate_weight_names``), and the token embedding equal to the fused one."""
    import mlx.core as mx
    from mlx_lm.gguf import translate_weight_names

    if not path.is_file():
        raise Fail(f"mlx_lm fuse --export-gguf wrote no {path.name}")
    tensors, metadata = mx.load(str(path), return_metadata=True)
    architecture = str(metadata.get("general.architecture", ""))
    if architecture != "llama":
        raise Fail(f"{path.name} reads back as architecture {architecture!r}, not llama")
    absent = sorted(name for name in (translate_weight_names(k) for k in weights) if name not in tensors)
    if absent:
        raise Fail(f"{path.name} lacks {len(absent)} of the fused model's {len(weights)} weights: "
                   f"{', '.join(absent[:5])}")
    embedding, fused_embedding = tensors.get("token_embd.weight"), weights.get("model.embed_tokens.weight")
    if embedding is None or fused_embedding is None or not mx.allclose(embedding.astype(mx.float32),
                                                                       fused_embedding.astype(mx.float32), atol=1e-2):
        raise Fail(f"{path.name}'s token embedding is not the fused model's")
    return {"gguf_tensors": len(tensors), "gguf_fused_weights_found": len(weights), "gguf_architecture": architecture}
