"""Run state, kept in ``config.stash``: the machine (probed once), one ``RecipeState`` per
recipe whose facts (tokenizer, rows, encoded data, model, the measured step, the overfit,
the saved checkpoint, the scan, the sustained run) are computed on demand and once
(``facts.fact``), the outcome of every check, and every measurement."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..machine.devices import Device, resolve_device
from ..machine.probes import Machine
from ..recipe.schema import Recipe
from ..outcomes import Fail, out_of_memory
from ..outputs.gate import Gate
from ..outputs.measurements import Measurement
from .facts import computed, fact

if TYPE_CHECKING:  # the facts' types; their modules import torch or transformers, so only for type checkers
    import datasets
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ..data.digest import DataDigest, Plan
    from ..data.encoding import Encoder
    from ..engine.distributed.jobs import DistributedJobs
    from ..engine.overfit import OverfitResult
    from ..engine.step import EvalMeasurement, StepMeasurement
    from ..engine.sustained_run import SustainedRun
    from ..forecast.levers import Lever, Report
    from ..machine.hub import Hub, ModelFiles
    from ..privacy.audit import ScanResult
    from ..trainers.base import Pipeline, PipelineInputs, ResumeRun, RunInputs, SavedRun, Trainer
    from ..trainers.worker import InterruptedResume

OTHER_CHUNK_BYTES = 16 * 2**20  # a chunk of rows for a pipeline other than the built-in encoder
CPU_SHORT_SECONDS = 10.0  # --ftready-cpu-short caps the sustained window
PROGRESS_EVERY_S = 3.0  # at most one progress line this often per recipe


@dataclass
class RunState:
    artifacts_root: Path
    machine_factory: Callable[[], Machine]
    recipe_paths: list[Path] = field(default_factory=list)
    cpu_short: bool = False
    hub_timeout_s: float = 10.0
    hub_factory: Optional[Callable[[], Any]] = None  # -> hub.Hub; default: the real hub and its cache
    free_bytes: Optional[Callable[[Path], int]] = None  # -> free bytes on a path's disk (tests: a small disk)
    gate: Gate = field(default_factory=Gate)  # every output passes through it (outputs/gate.py)
    telemetry_factory: Optional[Callable[..., Any]] = None  # (device, machine) -> (sources, missing); tests: fake NVML
    progress: Optional[Callable[[str], None]] = None  # a line for the terminal while long work runs
    pipeline_hook: Optional[Callable[..., Any]] = None  # (recipe, tokenizer) -> the team's pipeline or None
    # () -> trainers.conftest.OwnTrainerHook, or None where none is implemented
    trainer_hook: Optional[Callable[[], Any]] = None
    # processes for the data pass and the privacy scan (--ftready-workers); None: by CPUs and data size
    data_workers: Optional[int] = None
    regression: Optional[Any] = None  # outputs.regression.RegressionGate when a baseline is given
    loaded: dict[Path, Any] = field(default_factory=dict)  # recipe file -> its Recipe, or the RecipeError reading it
    recipes: dict[Path, "RecipeState"] = field(default_factory=dict)
    variants: dict[tuple, "RecipeState"] = field(default_factory=dict)  # (source, variant id) -> state
    models: dict[tuple, Any] = field(default_factory=dict)  # ([model] table, device) -> the loaded base model
    measurements: list[Measurement] = field(default_factory=list)

    @cached_property
    def machine(self) -> Machine:
        return self.machine_factory()

    @cached_property
    def hub(self) -> Hub:
        from ..machine.hub import RealHub

        return self.hub_factory() if self.hub_factory else RealHub()

    def disk_free(self, path: Path) -> int:
        from ..machine.hub import free_bytes

        return (self.free_bytes or free_bytes)(path)

    def load(self, path: Path) -> Recipe:
        """The recipe at ``path``, read once per run (a RecipeError, remembered, raised again)."""
        from ..recipe import RecipeError, load_recipe

        key = Path(path).resolve()
        if key not in self.loaded:
            try:
                self.loaded[key] = load_recipe(path)
            except RecipeError as exc:
                self.loaded[key] = exc
        found = self.loaded[key]
        if isinstance(found, RecipeError):
            raise found
        return found

    def header_lines(self) -> list[str]:
        """What each trainer config's translation says (what became what, what is not checked):
        the report header's lines; a config that cannot be read says nothing here (collection
        reports it)."""
        from ..recipe import RecipeError

        lines = []
        for path in self.recipe_paths:
            try:
                origin = self.load(path).origin
            except RecipeError:
                continue
            if origin is not None:
                lines += origin.header_lines()
        return lines

    def summary(self, quiet: bool) -> list[tuple[str, list[str]]]:
        """The terminal summary, as (separator title or "", lines): the measurements; under -q
        (which hides the header) what the trainer configs leave unchecked; the regression gate's
        verdict."""
        from ..outputs import measurements

        sections = []
        if self.measurements:
            sections.append(("ftready measurements", self.gate.lines(measurements.summary_lines(self.measurements))))
        if quiet:
            sections.append(("", [line for state in self.recipes.values() if state.recipe.origin is not None
                                  for line in state.recipe.origin.unchecked_lines()]))
        if self.regression is not None:
            sections.append(("", [self.regression.summary()]))
        return [(title, lines) for title, lines in sections if lines]

    def finish(self, records: list, warn: Callable[[str], None]) -> bool:
        """The end of the session: this run's scratch folders (and those of runs killed before
        they could) removed; each recipe's figures, report and CI summary written from its
        ``records`` (outputs.records.RecipeRun). True when an artifact could not be written (the
        exit status is then 1 whatever the checks' outcomes); ``warn`` says which."""
        import shutil

        from ..files import remove_dead_scratch
        from ..outputs import measurements, report, summary

        for state in [*self.recipes.values(), *self.variants.values()]:
            if "scratch" in vars(state):  # this run's checkpoints and trained weights
                shutil.rmtree(state.scratch, ignore_errors=True)
            remove_dead_scratch(state.artifacts)
        reports, incomplete = {}, False
        for state, record in zip(self.recipes.values(), records):
            try:
                if record.ran() or record.measurements:  # --collect-only leaves the last run's figures alone
                    measurements.write_figures(state.artifacts, record.partial, record.measurements, state.series,
                                               self.gate.write_json)
                if record.ran():  # --collect-only, or a session stopped before any check: no report to replace
                    reports[record.name] = report.write_report(state.artifacts, record, write=self.gate.write)
            except Fail as exc:
                warn(f"ftready {state.recipe.name}: {exc} (the run's artifacts are incomplete: exit status 1 whatever "
                     "the checks' outcomes)")
                incomplete = True
        summary.append_step_summary([r for r in records if r.ran()], reports, gate=self.gate.text)
        return incomplete

    def recipe_state(self, recipe: Recipe) -> "RecipeState":
        state = self.recipes.get(recipe.source)
        if state is None:
            state = self.recipes[recipe.source] = RecipeState(recipe=recipe, run=self)
        return state

    def variant_state(self, variant_recipe: Recipe, variant_id: str) -> "RecipeState":
        """The state of one ``ftready_variants`` combination: its own facts, built once per session."""
        key = (variant_recipe.source, variant_id)
        if key not in self.variants:
            self.variants[key] = RecipeState(recipe=variant_recipe, run=self, variant=variant_id)
        return self.variants[key]

    def base_model(self, recipe: Recipe, torch_device: str, load: Callable[[], Any]) -> Any:
        """Recipes (and variants) whose [model] tables are equal share one loaded base model."""
        key = (tuple(sorted((k, str(v)) for k, v in recipe.model.items())), torch_device)
        if key not in self.models:
            self.models[key] = load()
        return self.models[key]


@dataclass
class RecipeState:
    recipe: Recipe
    run: RunState
    outcomes: dict[str, str] = field(default_factory=dict)  # check id -> passed | failed | skipped
    blocked: dict[str, str] = field(default_factory=dict)  # check id -> the failed check that stopped it
    facts: dict[str, Any] = field(default_factory=dict)  # fact name -> value or facts.Failed
    series: dict[str, dict[str, list]] = field(default_factory=dict)  # check -> name -> values
    variant: str = ""  # the ftready_variants id ("micro_batch_size=2-...") of a variant's state
    asking: Optional[str] = None  # the id of the check whose body runs now
    timer: Optional[Callable[..., list]] = None  # that check's step timer (pytest-benchmark when active)
    _last_progress: float = 0.0

    @property
    def label(self) -> str:
        """The recipe's name, with the variant for a variant's state: ``tiny[micro_batch_size=2]``."""
        return f"{self.recipe.name}[{self.variant}]" if self.variant else self.recipe.name

    @property
    def artifacts(self) -> Path:
        base = self.run.artifacts_root / self.recipe.name
        return base / "variants" / self.variant if self.variant else base

    @property
    def machine(self) -> Machine:
        return self.run.machine

    @cached_property
    def scratch(self) -> Path:
        """This run's own working folder inside the artifacts folder (checkpoints, trained
        weights): two runs sharing an artifacts folder never touch each other's work. The
        plugin removes it at the end of the session; the next run removes those of runs killed
        before they could."""
        from ..files import scratch_dir

        return scratch_dir(self.artifacts)

    @cached_property
    def device(self) -> Device:
        return resolve_device(self.machine, self.recipe.hardware.device)

    @property
    def torch_device(self) -> str:
        """The torch device string; a Fail if the recipe's device is not on this machine."""
        if self.device.missing:
            raise Fail(self.device.missing)
        return self.device.torch_device

    def progress(self, line: str, force: bool = False) -> None:
        """A progress line for the terminal while long work runs, at most every few seconds."""
        now = time.monotonic()
        if self.run.progress and (force or now - self._last_progress >= PROGRESS_EVERY_S):
            self._last_progress = now
            self.run.progress(f"ftready {self.label}: {line}")

    def _load(self, what: str, load: Callable[[], Any]) -> Any:
        """Loading failures (OSError, ValueError, ImportError... all mean "cannot load") as one Fail."""
        try:
            return load()
        except Exception as exc:  # noqa: BLE001 - any exception here means the artifact cannot be loaded
            source = self.recipe.model.path or f"{self.recipe.model.id}@{self.recipe.model.revision}"
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if out_of_memory(exc):
                raise Fail(f"out of memory loading the {what} from {source} on {self.device.name}: "
                           f"{out_of_memory(exc)} "
                           "(a smaller dtype or [model] quantization = \"4bit\" lowers what loading needs)") from None
            raise Fail(f"cannot load the {what} from {source}: {type(exc).__name__}: {first}") from None

    # ---- the model and the data ------------------------------------------------------------
    @fact
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The recipe's tokenizer with its chat template override."""
        from ..engine.loading import load_tokenizer

        return self._load("tokenizer", lambda: load_tokenizer(self.recipe))

    @fact
    def model(self) -> PreTrainedModel:
        """The base model on the recipe's device, loaded once per recipe per session."""
        from ..engine.loading import load_model

        device = self.torch_device
        return self.run.base_model(self.recipe, device, lambda: self._load("model",
                                                                           lambda: load_model(self.recipe, device)))

    def shared_base(self) -> PreTrainedModel:
        return self.model

    def data_plan(self) -> Plan:
        """How the data pass reads rows and how much of them it keeps (data.digest.Plan): enough
        trainable examples from the start for every check that trains (overfit, resume, the
        distributed job) and the longest ones for the worst-case batch."""
        from ..data.digest import Plan

        data, t, c = self.recipe.data, self.recipe.training, self.recipe.checks
        d = self.recipe.distributed
        ranks = max(1, d.world_size or len(self.machine.gpus)) * d.nnodes
        per_step = t.micro_batch_size * ranks
        return Plan(format=data.format, train_on=data.train_on, roles=tuple(sorted((data.roles or {}).items())),
                    sample=data.sample, keep_rows=256,
                    keep_first=max(256, c.overfit_examples, per_step * t.gradient_accumulation_steps
                                   * (c.resume_steps + 2)),
                    keep_longest=max(8, per_step))

    def encoding_plan(self) -> Plan:
        """``data_plan`` for a pass that encodes: rows holding the tokenizer's special tokens as text are marked."""
        from dataclasses import replace

        from ..data.specials import reserved_tokens

        return replace(self.data_plan(), reserved=reserved_tokens(self.tokenizer))

    @fact
    def rows(self) -> DataDigest:
        """Every row of every training file read and shaped, no tokenizer needed
        (data.digest.DataDigest, its reading part)."""
        return self._data_pass(encoding=False)

    def _data_pass(self, encoding: bool) -> DataDigest:
        """One streaming pass over the training files (data.passes.run_pass), in worker processes
        when the data is large and the pipeline's encoder can be sent to them (pickled)."""
        from ..data.passes import PassFailed, run_pass, workers_for

        files, options = self.recipe.data.train, {}
        if encoding:
            pipeline = self.pipeline
            if pipeline.encoder is not None:
                options["encoder"] = pipeline.encoder
            else:  # the team's function or a trainer's: here, in large chunks (TRL starts a trainer per chunk)
                options.update(self._encoding())
        # a team's or a trainer's encode function stays in this process (it may not pickle)
        in_workers = not encoding or "encoder" in options
        workers = workers_for(self.run.data_workers, files, encoding) if in_workers else 1
        try:
            plan = self.encoding_plan() if encoding else self.data_plan()
            return run_pass(files, plan, workers=workers, progress=self.progress, **options)
        except PassFailed as exc:
            raise Fail(str(exc)) from None

    def _encoding(self) -> dict:
        """How this process encodes a chunk with the recipe's pipeline: ``encode`` and ``chunk_bytes``."""
        from ..data.passes import encode_with
        from ..data.rows import CHUNK_BYTES

        pipeline = self.pipeline
        if pipeline.encoder is not None:
            return {"encode": lambda pairs: encode_with(pipeline.encoder, pairs), "chunk_bytes": CHUNK_BYTES}
        return {"encode": lambda pairs: pipeline.encode([row for row, _ in pairs]), "chunk_bytes": OTHER_CHUNK_BYTES}

    @fact
    def dataset(self) -> datasets.Dataset:
        """Every trainable example as the recipe's pipeline makes it, written chunk by chunk to an
        Arrow file in this run's scratch folder and opened memory-mapped (a ``datasets.Dataset`` of
        ``input_ids``, ``attention_mask``, ``labels`` and ``where``): rows never all in memory."""
        import datasets

        from ..data.arrow import write_examples

        path = self.scratch / "dataset.arrow"
        self.progress("writing the training examples for ftready_dataset", force=True)
        try:
            write_examples(self.recipe.data.train, self.encoding_plan(), path=path, **self._encoding())
        except ValueError as exc:  # the pipeline cannot make examples (as in the data pass)
            raise Fail(str(exc)) from None
        return datasets.Dataset.from_file(str(path))

    @fact
    def stop_ids(self) -> frozenset[int]:
        """The end-of-turn token ids the labels must train: EOS and the recipe's stop tokens."""
        from ..data.encoding import stop_token_ids
        from ..engine.loading import generation_eos_ids

        try:
            return stop_token_ids(self.tokenizer, generation_eos_ids(self.recipe), self.recipe.data.stop_tokens)
        except ValueError as exc:  # a stop token the tokenizer does not know
            raise Fail(str(exc)) from None

    @fact
    def encoder(self) -> Encoder:
        """The built-in encoder for this recipe's tokenizer and [data] table (data.encoding.Encoder)."""
        from ..data.encoding import Encoder

        try:
            return Encoder(self.tokenizer, self.recipe.data, self.stop_ids)
        except ValueError as exc:  # no chat template, slow tokenizer
            raise Fail(str(exc)) from None

    # ---- the trainer: whose preprocessing and whose step the checks run ----------------------
    @fact
    def trainer(self) -> Trainer:
        """The recipe's trainer (trainers.base.Trainer): the team's own Trainer where a conftest
        implements ``pytest_ftready_trainer``; else the one [data] pipeline names, the config's
        own trainer where it is installed, else the built-in engine."""
        from ..trainers import select_trainer

        return select_trainer(self.recipe, self.run.trainer_hook() if self.run.trainer_hook is not None else None)

    @fact
    def pipeline(self) -> Pipeline:
        """What makes the training examples: the team's (``pytest_ftready_pipeline`` hook), else
        the recipe's trainer's."""
        from ..trainers.base import as_pipeline

        hook = self.run.pipeline_hook
        provided = hook(self.recipe, self.tokenizer) if hook is not None else None
        if provided is None:
            return self.trainer.pipeline(self.pipeline_inputs())
        return as_pipeline(provided, self.recipe, self.tokenizer, self.stop_ids)

    def pipeline_inputs(self) -> PipelineInputs:
        """What the recipe's trainer builds its pipeline from (trainers.base.PipelineInputs)."""
        from ..trainers.base import PipelineInputs

        return PipelineInputs(self.recipe, self.tokenizer, self.stop_ids, self.device, lambda: self.scratch,
                              lambda: self.encoder)

    def run_inputs(self) -> RunInputs:
        """What the recipe's trainer's runs are handed (trainers.base.RunInputs): made when a run
        starts, with the examples, the shared base model and this check's timer."""
        from ..trainers.base import RunInputs

        return RunInputs(self.recipe, self.tokenizer, self.stop_ids, self.device, lambda: self.scratch,
                         lambda: self.encoder,
                         examples=tuple(self.training_examples()), pad_id=self.tokenizer.pad_token_id,
                         base=self.shared_base, progress=self.progress, timer=self.timer)

    def _engine(self) -> Optional[Trainer]:
        """The built-in engine as a trainer; None when it is the recipe's own trainer."""
        from ..trainers import ENGINE, trainer_named

        return None if self.trainer.name == ENGINE else trainer_named(ENGINE)

    def run_names(self) -> dict[str, str]:
        """Whose preprocessing and whose step this recipe's checks ran, for the measurements
        ``pipeline`` and ``step_trainer``; never raises (a pipeline that failed to build is
        named by the trainer that would have built it)."""
        trainer, pipeline = self.trainer, self.computed("pipeline")
        return {"pipeline": pipeline.name if pipeline is not None else trainer.name,
                "step_trainer": trainer.step_trainer}

    @fact
    def digest(self) -> DataDigest:
        """Every usable row as the recipe's pipeline makes it, kept as a data.digest.DataDigest:
        counts, length arrays, the first places of each problem, bounded samples."""
        try:
            return self._data_pass(encoding=True)
        except ValueError as exc:  # the pipeline cannot make examples (TRL refuses to start, rows it cannot load)
            raise Fail(str(exc)) from None

    @fact
    def trainable_examples(self) -> list:
        """Trainable examples kept by the data pass: the first ones in order, then the longest."""
        return self.digest.training_examples()

    @fact
    def length_p95(self) -> Optional[float]:
        """The p95 of the untruncated row lengths (the figure data.lengths reports and lever advice quotes)."""
        from ..units import percentile

        return percentile(self.digest.full_lengths, 0.95) or None

    def training_examples(self) -> list:
        """The trainable examples, or a Fail that says why there are none."""
        if not self.trainable_examples:
            raise Fail("no trainable example (see data.format and data.masking)")
        return self.trainable_examples

    # ---- what the engine measures ------------------------------------------------------------
    @fact
    def step(self) -> StepMeasurement:
        """The worst-case training step as the recipe's trainer runs it (engine.step.StepMeasurement)."""
        return self.trainer.step(self.run_inputs())

    @fact
    def engine_step(self) -> StepMeasurement:
        """The built-in engine's worst-case step, the one every trainer's is shown beside."""
        engine = self._engine()
        return self.step if engine is None else engine.step(self.run_inputs())

    @fact
    def eval_rows(self) -> int:
        """Rows the run evaluates on: every row of the [data] eval files, and eval_split of the training rows."""
        from ..data.passes import run_pass

        data = self.recipe.data
        held_out = math.ceil(self.rows.rows * data.eval_split) if data.eval_split else 0
        if not data.eval:
            return held_out
        return held_out + run_pass(data.eval, self.data_plan(), progress=self.progress).rows

    @fact
    def eval_step(self) -> EvalMeasurement:
        """The worst-case evaluation forward, measured by the built-in engine (engine.step.EvalMeasurement)."""
        from ..engine.step import measure_eval_step

        t, device = self.recipe.training, self.device
        return measure_eval_step(self.recipe, self.training_examples(), self.tokenizer.pad_token_id, self.torch_device,
                                 self.shared_base, batch_size=t.eval_batch_size or t.micro_batch_size,
                                 capacity_bytes=device.memory_total_bytes, count_tensors=not device.is_accelerator)

    @fact
    def overfit(self) -> OverfitResult:
        """The trainer's overfit of the first ``overfit_examples`` examples (engine.overfit.OverfitResult)."""
        return self.trainer.overfit(self.run_inputs())

    @fact
    def engine_overfit(self) -> OverfitResult:
        """The built-in engine's overfit of the same examples."""
        engine = self._engine()
        return self.overfit if engine is None else engine.overfit(self.run_inputs())

    @fact
    def saved_run(self) -> SavedRun:
        """The trainer's straight run and its checkpoint at half the steps (trainers.base.SavedRun)."""
        return self.trainer.saved_run(self.rehearsal_inputs())

    @fact
    def resume_run(self) -> ResumeRun:
        """The trainer's resume of ``saved_run`` in a fresh process (trainers.base.ResumeRun)."""
        from ..trainers.worker import resume

        return resume(self.trainer, self.rehearsal_inputs(), self.saved_run)

    def rehearsal_inputs(self) -> RunInputs:
        """``run_inputs`` with the resume rehearsal's recipe (trainers.base.rehearsal_recipe: its
        accumulation bounded; the fresh process bounds it the same way)."""
        from dataclasses import replace

        from ..trainers.base import rehearsal_recipe

        return replace(self.run_inputs(), recipe=rehearsal_recipe(self.recipe))

    @fact
    def interrupted_saves(self) -> list[InterruptedResume]:
        """The save after ``saved_run``'s checkpoint killed before each file, and what the trainer's
        resume did each time (trainers.worker.InterruptedResume)."""
        from ..trainers.worker import interrupted_saves

        return interrupted_saves(self.trainer, self.run_inputs(), self.saved_run)

    @fact
    def sustained(self) -> SustainedRun:
        """The recipe's step trained for the sustained window with telemetry (engine.sustained_run)."""
        from ..engine.sustained_run import run_sustained
        from ..machine.telemetry import sources_for

        c = self.recipe.checks
        warmup_s, total_s, window_s = c.warmup_seconds, c.sustained_seconds, c.window_seconds
        if not self.device.is_accelerator:  # --ftready-cpu-short
            total_s = min(total_s, CPU_SHORT_SECONDS)
            warmup_s, window_s = min(warmup_s, total_s / 5), min(window_s, total_s / 5)
        sources, missing = (self.run.telemetry_factory or sources_for)(self.device, self.machine)
        return run_sustained(self.recipe, self.training_examples(), self.tokenizer.pad_token_id, self.torch_device,
                             self.shared_base, warmup_s, total_s, window_s, sources, missing, progress=self.progress)

    @fact
    def memory_forecast(self) -> Report:
        """The worst-case step's peak memory forecast from the model config alone, judged against
        the recipe's target (forecast.levers.Report)."""
        from ..forecast.levers import forecast_report
        from ..forecast.trace import ConfigUnavailable, TraceError
        from ..machine.targets import TargetError, recipe_target
        from ..outcomes import Skip

        try:
            target = recipe_target(self.recipe, self.device)
        except TargetError as exc:
            raise Fail(str(exc)) from None
        try:
            p95 = self.length_p95
        except Fail:  # no tokenizer here (a hub model offline): the max_length lever is left out
            p95 = None
        try:
            return forecast_report(self.recipe, target, p95_length=p95)
        except ConfigUnavailable as exc:
            raise Skip(f"the model's config is not available here: {exc}") from None
        except TraceError as exc:
            raise Skip(str(exc)) from None

    @fact
    def levers(self) -> list[Lever]:
        """The levers this recipe can pull, each with its saving (forecast.levers, the lever
        model the forecast shares): traced by the forecast where it runs, estimated from the measured step's
        breakdown where it cannot (no config here, a step that cannot be traced)."""
        from ..forecast.levers import ModelShape, estimated_levers, with_levers
        from ..outcomes import Skip

        try:
            return list(with_levers(self.memory_forecast).levers)
        except (Skip, Fail):
            step = self.step
            return estimated_levers(self.recipe, step.breakdown, ModelShape(step.num_layers, step.vocab_size),
                                    self.length_p95)

    @fact
    def distributed_jobs(self) -> DistributedJobs:
        """The recipe's torchrun jobs (engine.distributed.jobs.DistributedJobs), planned once; the
        distributed checks share its launches."""
        from ..engine.distributed.jobs import DistributedJobs, plan, visible_gpus
        from ..outcomes import Skip

        device, _ = self.device, self.torch_device  # a Fail when the recipe's device is not here
        try:
            resolved = plan(self.recipe, device.kind, visible_gpus(len(self.machine.gpus)))
        except ValueError as exc:
            raise Fail(str(exc)) from None
        if resolved.total_ranks <= 1:
            raise Skip(f"[distributed] world_size resolves to 1 here "
                       f"({'1 GPU' if device.is_accelerator else 'no GPU visible'}); "
                       "write world_size = 2 with backend = \"gloo\" to rehearse the job on the CPU")
        return DistributedJobs(self.recipe, resolved, self.artifacts / "distributed", self.training_examples(),
                               self.tokenizer.pad_token_id, self.recipe.checks.resume_steps, progress=self.progress)

    # ---- what the hub and the files say --------------------------------------------------------
    @fact
    def model_files(self) -> ModelFiles:
        """The model's files with their sizes (hub metadata, cache, or the local folder)."""
        from ..machine.hub import HubUnavailable, folder_files
        from ..outcomes import Skip

        recipe = self.recipe
        if recipe.model.path:
            return folder_files(Path(recipe.model.path))
        try:
            return self.run.hub.model_files(recipe.model.id, recipe.model.revision, self.run.hub_timeout_s)
        except HubUnavailable as exc:
            raise Skip(f"{exc}; set HF_HUB_OFFLINE=0 with network, or download the model first") from None

    @fact
    def scan(self) -> ScanResult:
        """One scan of the training data and [privacy] scan_paths for every category (privacy.audit.ScanResult)."""
        from ..privacy.audit import scan_paths
        from ..data.passes import PassFailed

        try:
            return scan_paths([*self.recipe.data.train, *self.recipe.privacy.scan_paths],
                              frozenset(self.recipe.privacy.scan), self.recipe.privacy.allowlist,
                              learn=self.run.gate.learn_one, progress=self.progress,
                              workers=self.run.data_workers)
        except PassFailed as exc:  # a scan worker died: the privacy checks fail, naming the remedy
            raise Fail(str(exc)) from None

    def computed(self, name: str) -> Any:
        """A fact some check already computed, else None (e.g. the sustained rate, if measured)."""
        return computed(self, name)

    # ---- results ------------------------------------------------------------------------------
    def record(self, check: str, name: str, value: Any, unit: str, estimate: bool = False,
               case: str = "") -> Measurement:
        m = Measurement(recipe=self.label, check=check, name=name, value=value, unit=unit, estimate=estimate,
                        case=case)
        self.run.measurements.append(m)
        return m

    def add_series(self, check: str, name: str, values: list) -> None:
        self.series.setdefault(check, {})[name] = list(values)

    def failed_prerequisite(self, requires: tuple[str, ...]) -> Optional[str]:
        """The failed check behind a prerequisite: one that failed, or that was itself stopped
        by a failure further up (data.masking -> model.overfit -> lifecycle.generate). A
        prerequisite that did not run (deselected) stops nothing: the facts are computed."""
        for check_id in requires:
            if self.outcomes.get(check_id) == "failed":
                return check_id
            if check_id in self.blocked:
                return self.blocked[check_id]
        return None
