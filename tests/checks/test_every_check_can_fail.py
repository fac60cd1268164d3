"""Every registered check can fail: for each one, a planted input (a recipe, data, a model
folder, or a described machine, the engine's figures where this machine cannot produce them)
makes it fail with its own message. A check that no input can fail is reported by name: a
verdict that cannot say no tells its user nothing."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace
from typing import Callable

import pytest

from pytest_ftready.checks.registry import REGISTRY, CheckSpec, all_checks
from pytest_ftready.outcomes import Fail, Skip
from tests import fakes, planted
from tests.checks.test_checkpoint_headroom import hub_state  # noqa: F401 - a fixture the plants use
from tests.checks.test_distributed import gpu_job
from tests.checks.test_embedding_rows import zeroed_chat_token
from tests.checks.test_sustained import gpu_state  # noqa: F401 - a fixture the plants use
from tests.data.test_encoding import CHATML_EOS_OUTSIDE
from tests.helpers import job_result, private_model

GiB = 1024 ** 3


@dataclasses.dataclass
class Kit:
    """What a plant may use: the tiny example's state maker, the example folder, this machine."""
    make_state: Callable
    example: object
    machine: object
    monkeypatch: object
    request: object

    def recipe_with(self, text: str, **edits):
        """The tiny recipe with ``text`` appended (new tables or keys), then ``edits``."""
        path = self.example / "recipe.toml"
        path.write_text(path.read_text() + "\n" + text + "\n")
        return self.make_state(**edits)

    def rows(self, change: Callable[[list], None]):
        """The tiny data with ``change(rows)`` applied in place."""
        data = self.example / "data" / "train.jsonl"
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        change(rows)
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return self.make_state()

    def machine_with(self, **host):
        return dataclasses.replace(self.machine, host=dataclasses.replace(self.machine.host, **host))


def _say(index: int, text: str) -> Callable[[list], None]:
    def change(rows):
        rows[index]["messages"][-1]["content"] = text
    return change


def _bad_row(rows):
    rows[3] = {"messages": [{"role": "human", "content": ""}]}


def _stops_early(kit):
    from pytest_ftready.forecast import trace

    real = trace.measured_step_peak
    kit.monkeypatch.setattr(trace, "measured_step_peak", lambda *a, **k: 2 * real(*a, **k))  # a forecast 50 % low
    return kit.make_state()


def _template(kit, text: str):
    (kit.example / "planted.jinja").write_text(text)
    return kit.make_state(sample='4\nchat_template = "planted.jinja"')


def _index_names_a_missing_shard(kit):
    model = private_model(kit.example)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00002-of-00002.safetensors"}}))
    return kit.make_state()


def _leaky_packing(kit):
    state = kit.make_state(packing="true")
    state.model.set_attn_implementation(planted.leaky_attention())
    return state


def _checkpoint_without_numpy_rng(kit):
    import torch

    from pytest_ftready.engine.checkpoint import STATE_FILE

    state = kit.make_state()
    folder = state.saved_run.folder
    saved = torch.load(folder / STATE_FILE, weights_only=True)
    del saved["rng"]["numpy"]
    torch.save(saved, folder / STATE_FILE)
    return state


def _resume_taking_a_partial_checkpoint(kit):
    """A trainer with no check before its resume, whose resume trains from any folder it is handed."""
    from pytest_ftready.trainers import worker
    from pytest_ftready.trainers.builtin import EngineTrainer

    kit.monkeypatch.setattr(EngineTrainer, "check_saved", lambda self, saved: None)
    kit.monkeypatch.setattr(worker, "run", lambda trainer, requests, timeout_s=None: {
        "each": [{"logs": [[3, 1.0, None, None]]} for _ in requests]})
    return kit.make_state()


def _with_step(kit, **figures):
    state = kit.make_state()
    state.step = dataclasses.replace(state.step, **figures)
    return state


def _jobs(state, **jobs):
    state.distributed_jobs = SimpleNamespace(plan=SimpleNamespace(device_kind="cuda", backend="nccl", world_size=2,
                                                                  reshard_world_size=1), steps=4, **jobs)
    return state


def _rank_dies(kit):
    from pytest_ftready.engine.distributed.launcher import Failure

    dead = Failure(1, "join", "killed by signal SIGKILL", ["rank 1 is going"], [])
    return _jobs(kit.make_state(), run=lambda: job_result("run", {}, failure=dead))


def _rank_over_capacity(kit):
    figures = {"peak_bytes": 2 * GiB, "step_seconds": 0.1, "capacity_bytes": GiB, "capacity_source": "the device",
               "peak_method": "max_memory_allocated"}
    return _jobs(kit.make_state(), run=lambda: job_result("run", {"step": figures}))


def _resume_short(kit):
    return _jobs(kit.make_state(), run=lambda: job_result("run", {"train": {"losses": [3.0, 2.5, 2.0, 1.5]}}),
                 resume=lambda: job_result("resume", {"resume": {"losses": [2.0]}}))


def _slow_collectives(kit):
    from pytest_ftready.machine.links import GpuLinks

    state = kit.make_state()
    state.distributed_jobs = gpu_job(40e9, GpuLinks(nvlink_version=6, nvlinks_active=18).to_dict())
    return state


def _sweep_out_of_memory(kit):
    from pytest_ftready.engine import step

    real = step.measure_step
    kit.monkeypatch.setattr(step, "measure_step", lambda *a, **k: dataclasses.replace(
        real(*a, **k), out_of_memory="CUDA out of memory. Tried to allocate 2.00 GiB"))
    return kit.make_state(), {"training.micro_batch_size": 8}


def _world_readable_data(kit):
    import shutil
    import tempfile

    shared = tempfile.mkdtemp(prefix="ftready-shared-")  # /tmp is traversable by everyone
    kit.request.addfinalizer(lambda: shutil.rmtree(shared))
    os.chmod(shared, 0o755)
    data = os.path.join(shared, "train.jsonl")
    with open(data, "w") as handle:
        handle.write((kit.example / "data" / "train.jsonl").read_text())
    os.chmod(data, 0o644)
    return kit.make_state(train=f'["{data}"]')


def _changed_data(kit):
    data = kit.example / "data" / "train.jsonl"
    data.write_text(data.read_text().replace("likes", "loves", 1))
    return kit.make_state()


# check id -> (plant(kit) -> state or (state, param), a phrase of the failure it must raise)
def _seeding_numpy_otherwise(kit):  # numpy seeded with another seed than the recipe's
    import random

    import numpy as np
    import torch

    from pytest_ftready.engine import batches

    kit.monkeypatch.setattr(batches, "seed_everything", lambda seed: (random.seed(seed), np.random.seed(seed + 1),
                                                                  torch.manual_seed(seed)))
    return kit.make_state()


PLANTS: dict[str, tuple[Callable, str]] = {
    "repro.environment": (lambda k: k.make_state(machine=dataclasses.replace(
        k.machine, torch=dataclasses.replace(k.machine.torch, version=None))), "torch is not installed"),
    "stack.driver": (lambda k: k.make_state(machine=fakes.nvidia(driver="470.199.02", driver_cuda=11040)),
                     "supports CUDA up to 11.4"),
    "stack.arch": (lambda k: k.make_state(machine=fakes.nvidia(name="NVIDIA GeForce RTX 5090", cc=(12, 0))),
                   "no kernel image is available"),
    "stack.precision": (lambda k: k.make_state(machine=k.machine_with(cpu_flags=("avx2",)), dtype='"bfloat16"'),
                        "has no native bfloat16"),
    "stack.kernels": (lambda k: k.make_state(attn_implementation='"flash_attention_2"'), "needs flash attention 2"),
    "stack.mlx": (lambda k: k.make_state(machine=fakes.apple(), device='"mlx"'), "mlx-lm is not installed"),
    "stack.smoke": (lambda k: k.make_state(device='"cuda"'), "the recipe asks for cuda"),
    "stack.known_bugs": (lambda k: k.make_state(machine=dataclasses.replace(k.machine, packages=(("peft", "0.3.0"),)),
                                                optimizer='"adamw"\ngradient_checkpointing = true'),
                         "peft-checkpointing-frozen-inputs"),  # issue 31's check (peft < 0.4 with checkpointing)
    "checkpoint.revision": (lambda k: k.request.getfixturevalue("hub_state")(revision="main"), "is a branch or tag"),
    "checkpoint.files": (_index_names_a_missing_shard, "lacks model-00002-of-00002.safetensors"),
    "checkpoint.token_rows": (zeroed_chat_token, "'<|im_end|>' (id 5, model.embed_tokens.weight: norm 0, a zero row"),
    "checkpoint.disk": (lambda k: k.request.getfixturevalue("hub_state")(free=10 ** 9), "needs more than the"),
    "data.format": (lambda k: k.rows(_bad_row), "rows are unusable"),
    "data.template": (lambda k: _template(k, "{{ raise_exception('this template renders no conversation') }}"),
                      "this template renders no conversation"),
    "data.masking": (lambda k: _template(k, CHATML_EOS_OUTSIDE), "stop_untrained"),
    "data.lengths": (lambda k: k.make_state(max_length="1024"), "exceeds the model's max_position_embeddings 512"),
    "data.packing": (_leaky_packing, "lets packed examples attend across their boundaries"),
    "model.memory_forecast": (lambda k: k.make_state(memory_headroom='0.10\ntarget = "GTX 9000"'),
                              "is neither a size"),  # tests/forecast/test_trace.py plants "does not fit"
    "model.forecast_error": (_stops_early, "off the measured"),
    "model.step_memory": (lambda k: k.make_state(machine=k.machine_with(memory_total_bytes=4 * 1024 ** 2)),
                          "the worst-case step needs"),
    "model.eval_memory": (lambda k: k.make_state(machine=k.machine_with(memory_total_bytes=24 * 1024 ** 2),
                                                 packing="false\neval_split = 0.9",
                                                 micro_batch_size="4\ncompute_metrics = true"),
                          "of logits accumulate over 45 eval rows"),  # 45 x 128 x 1000 x 4 bytes > 24 MiB less 10 %
    "data.loader": (lambda k: _with_step(k, step_seconds=1e-9), "the accelerator waits on data"),
    "model.overfit": (lambda k: k.make_state(overfit_steps="1"), "overfit of 8 examples"),
    "lifecycle.resume": (_checkpoint_without_numpy_rng, "the checkpoint lacks"),
    "lifecycle.interrupted_save": (_resume_taking_a_partial_checkpoint, "and the resume takes it as complete"),
    "lifecycle.generate": (lambda k: k.make_state(overfit_steps="2", overfit_loss="0.1\nmax_new_tokens = 1"),
                           "does not stop within 1"),
    "lifecycle.mlx_export": (lambda k: _quantized_base_for_gguf(k), "--dequantize --export-gguf"),
    "lifecycle.serving_template": (lambda k: _serving_template_without_the_stop(k),
                                   "without the trained end-of-turn token <|im_end|>"),
    "lifecycle.ollama": (lambda k: _modelfile(k, "FROM ./tiny.gguf\nPARAMETER stop </s>\n"),
                         "is not the trained end-of-turn token <|im_end|>"),
    "lifecycle.vllm_adapter": (lambda k: k.recipe_with('[serving]\nengine = "vllm"', r="32"),
                               "above vLLM's max_lora_rank 16"),
    "lifecycle.gguf": (lambda k: _tokenizer_the_converter_does_not_know(k), "BPE pre-tokenizer was not recognized"),
    "lifecycle.merged_model": (lambda k: _merged_into_the_quantized_base(k), "the small delta is rounded away"),
    "distributed.launch": (_rank_dies, "rank 1 failed in phase 'join'"),
    "distributed.collectives": (_slow_collectives, "under 25% of what rank 0's link should give"),
    "distributed.step": (_rank_over_capacity, "does not fit on every rank"),
    "distributed.resume": (_resume_short, "returned 1 loss(es) after the resume"),
    "levers.advice": (lambda k: k.make_state(machine=k.machine_with(memory_total_bytes=4 * 1024 ** 2)), "the step needs"),
    "levers.sweep": (_sweep_out_of_memory, "runs out of memory"),
    "sustained.throughput": (lambda k: k.request.getfixturevalue("gpu_state")([1000, 1000, 900, 700]), "throughput fell"),
    "sustained.thermal": (lambda k: k.request.getfixturevalue("gpu_state")([1000] * 4), "the GPU reached"),
    "headroom.disk": (lambda k: _small_disk(k.make_state()), "the run writes"),
    "headroom.time": (lambda k: _with_step(k, step_seconds=1e4), "but max_hours is 1.0"),
    "repro.pins": (lambda k: k.recipe_with('[pins]\npackages = { torch = "0.0.1" }'), "differ from the pins"),
    "repro.config": (_seeding_numpy_otherwise, "did not reach numpy"),
    "repro.manifest": (_changed_data, "train.jsonl: sha256"),
    "privacy.license": (lambda k: k.make_state(license='"llama3.1"'), "not one of [privacy] licenses"),
    "privacy.permissions": (_world_readable_data, "is reachable by group and others"),
    "privacy.secrets": (lambda k: k.rows(_say(0, f"key {planted.SECRETS['github_token']}")), "secret finding"),
    "privacy.pii": (lambda k: k.rows(_say(0, f"write to {planted.PII['email']}")), "personal data finding"),
    "privacy.retention": (lambda k: k.make_state(backups='{ path = "backups", encrypted = false }'),
                          "declared unencrypted"),
}


def _quantized_base_for_gguf(kit):
    """An MLX recipe declaring a GGUF export of a 4-bit base (tests/trainers/test_mlx.py runs the real one)."""
    model = kit.example / "q4-model"
    model.mkdir()
    source = (kit.example / "model").resolve()
    for file in source.iterdir():
        (model / file.name).symlink_to(file)
    (model / "config.json").unlink()
    config = json.loads((source / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "quantization": {"bits": 4, "group_size": 64}}))
    text = (kit.example / "recipe.toml").read_text().replace('path = "model"', 'path = "q4-model"')
    (kit.example / "recipe.toml").write_text(text)
    return kit.recipe_with('[export]\nformat = "gguf"', machine=fakes.apple(mlx_lm="0.32.2"), device='"mlx"')


def _serving_template_without_the_stop(kit):
    """A serving template that leaves the end-of-turn token out of an assistant turn's close."""
    trained = (kit.example / "model" / "chat_template.jinja").read_text(encoding="utf-8")
    served = trained.replace("message['content'] + '<|im_end|>' }}", "message['content'] }}")
    assert served != trained
    (kit.example / "serve.jinja").write_text(served, encoding="utf-8")
    return kit.recipe_with('[serving]\nengine = "vllm"\nchat_template = "serve.jinja"')


def _modelfile(kit, text: str):
    (kit.example / "Modelfile").write_text(text, encoding="utf-8")
    return kit.recipe_with('[serving]\nengine = "ollama"\nmodelfile = "Modelfile"')


def _merged_into_the_quantized_base(kit):
    """A QLoRA recipe (bitsandbytes 4-bit base) whose adapter is merged into the 4-bit base (peft#2321)."""
    path = kit.example / "recipe.toml"
    path.write_text(path.read_text().replace('attn_implementation = "sdpa"',
                                             'attn_implementation = "sdpa"\nquantization = "4bit"'))
    return kit.recipe_with('[serving]\nengine = "transformers"\nmerge_into = "quantized"')


def _tokenizer_the_converter_does_not_know(kit):
    """The tiny tokenizer, which llama.cpp's converter refuses (tests/serving/test_gguf.py; CI's
    serving job runs this plant with llama.cpp installed)."""
    from pytest_ftready.serving import gguf

    missing = gguf.missing() or ("" if gguf.find_converter(None) else gguf.GET_CONVERTER)
    if missing:  # CI's serving job has them: there a missing one fails
        (pytest.fail if os.environ.get("FTREADY_SERVING_CI") else pytest.skip)(
            f"lifecycle.gguf's plant runs llama.cpp's converter: {missing}")
    return kit.recipe_with('[serving]\nengine = "llama.cpp"')


def _small_disk(state):
    state.run.free_bytes = lambda path: 50 * 1024 ** 2
    return state


def fail_planted(check_id: str, kit: Kit) -> str:
    """Run ``check_id`` on its planted input; the failure's message. pytest.fail when the check
    has no plant, or passes or skips on it."""
    from pytest_ftready.session.context import CheckContext

    if check_id not in PLANTS:
        pytest.fail(f"{check_id}: no planted input makes it fail; a check no input can fail tells its user nothing "
                    "(plant one in PLANTS)")
    plant, phrase = PLANTS[check_id]
    made = plant(kit)
    state, param = made if isinstance(made, tuple) else (made, None)
    ctx = CheckContext(state, REGISTRY[check_id], param=param)
    try:
        with ctx.running():
            REGISTRY[check_id].body(ctx)
    except Fail as exc:
        assert phrase in str(exc), f"{check_id} failed, but not on its plant: {exc}"
        return str(exc)
    except Skip as exc:
        pytest.fail(f"{check_id} skipped on its planted input: {exc}")
    pytest.fail(f"{check_id} passed on its planted input ({phrase!r} expected): no input makes it fail")


@pytest.fixture
def kit(make_state, tiny_example, real_machine, monkeypatch, request) -> Kit:
    return Kit(make_state, tiny_example, real_machine, monkeypatch, request)


@pytest.mark.parametrize("check_id", [spec.id for spec in all_checks()])
def test_a_planted_input_fails_every_check(check_id, kit):
    fail_planted(check_id, kit)


def test_a_check_no_input_can_fail_is_reported_by_name(kit, monkeypatch):
    def records_only(ctx):
        ctx.measure("rows", 1, "rows")

    monkeypatch.setitem(REGISTRY, "demo.never", CheckSpec("demo.never", records_only, 0, "records only"))
    with pytest.raises(pytest.fail.Exception, match="demo.never: no planted input makes it fail"):
        fail_planted("demo.never", kit)
    monkeypatch.setitem(PLANTS, "demo.never", (lambda k: k.make_state(), "anything"))
    with pytest.raises(pytest.fail.Exception, match="demo.never passed on its planted input"):
        fail_planted("demo.never", kit)
