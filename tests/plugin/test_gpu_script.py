"""examples/gpu: the GPU run's script. Its parts here (which carried wheels a machine needs, the
requirements it still misses, the 135M-class shape, the summary of a GPU run's outputs), and the
whole script rehearsed on this CPU in the slow suite: the carry prepared for the GPU machine's
Python, then installed from, the models built, every run through pytest, the accelerator
checks skipped with their reasons, the summary saying that no GPU was found."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.helpers import outcomes

GPU = Path(__file__).resolve().parents[2] / "examples" / "gpu"


def load(name: str):
    """A module of examples/gpu, imported from its file (the script imports its neighbours by name)."""
    if str(GPU) not in sys.path:
        sys.path.insert(0, str(GPU))
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def wheel(folder: Path, name: str, version: str, requires: tuple = (), tag: str = "py3-none-any") -> Path:
    """A real (tiny) wheel file with its METADATA."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-{tag}.whl"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires), "\nRequires-Dist: in the description\n"])
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{dist}.dist-info/METADATA", meta)
        archive.writestr(f"{dist}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
    return path


def carry_folder(tmp_path: Path, wheels: list) -> Path:
    folder = tmp_path / "carry"
    (folder / "wheels").mkdir(parents=True)
    for name, version, requires, *tag in wheels:
        wheel(folder / "wheels", name, version, requires, *tag)
    (folder / "manifest.json").write_text(json.dumps({"extras": ["trl"]}))
    return folder


def test_the_plugin_always_goes_in_and_another_wheel_only_where_the_machine_lacks_it_or_it_is_too_old(tmp_path):
    gpu_carry = load("gpu_carry")
    folder = carry_folder(tmp_path, [
        ("pytest-ftready", "0.1.0", ("alpha>=2", "beta", "gamma; python_version < '3'", "delta>=1; extra == 'trl'")),
        ("alpha", "2.0", ("epsilon<2",)), ("beta", "1.0", ()), ("delta", "1.5", ()), ("epsilon", "1.0", ()),
        ("zeta", "1.0", ())])
    machine = {"pytest-ftready": "0.0.1", "alpha": "1.0", "beta": "0.5", "epsilon": "3.0", "zeta": "1.0"}
    plan = gpu_carry.plan_install(folder, version_of=machine.get)
    # alpha is too old there, delta (the trl extra's) missing, epsilon too new for the carried alpha;
    # beta has no bound, gamma's marker does not apply, zeta nothing needs
    assert sorted(plan.names()) == ["alpha 2.0", "delta 1.5", "epsilon 1.0", "pytest-ftready 0.1.0"]
    assert plan.present == {"beta": "0.5", "zeta": "1.0"} and plan.problems == []


def test_a_needed_wheel_for_another_python_and_a_missing_plugin_wheel_are_named(tmp_path):
    gpu_carry = load("gpu_carry")
    folder = carry_folder(tmp_path, [("pytest-ftready", "0.1.0", ("omega",)),
                                     ("omega", "1.0", (), "cp27-cp27m-manylinux1_x86_64")])
    plan = gpu_carry.plan_install(folder, version_of={}.get)
    assert plan.names() == ["pytest-ftready 0.1.0"]
    assert len(plan.problems) == 1 and "omega-1.0-cp27" in plan.problems[0] and "--python-version" in plan.problems[0]
    (folder / "wheels" / "pytest_ftready-0.1.0-py3-none-any.whl").unlink()
    assert "run ftready_gpu.py prepare first" in gpu_carry.plan_install(folder).problems[0]


def test_requirements_the_environment_does_not_meet_say_what_to_carry(tmp_path, monkeypatch):
    gpu_carry = load("gpu_carry")
    assert gpu_carry.unmet(["pytest-ftready"], ["trl"]) == []  # this test environment has everything
    info = tmp_path / "site" / "needy-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: needy\nVersion: 1.0\n"
                                   "Requires-Dist: pytest>=999\nRequires-Dist: no-such-package-here\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    problems = gpu_carry.unmet(["needy", "not-installed-at-all"])
    assert problems[0].startswith("needy 1.0 needs pytest>=999; this machine has ") and \
        "prepare --also 'pytest>=999'" in problems[0]
    assert problems[1].startswith("needy 1.0 needs no-such-package-here; this machine lacks it")
    assert problems[2] == "not-installed-at-all is not installed"


def test_the_image_table_and_the_135m_shape():
    import torch
    from transformers import LlamaForCausalLM

    from pytest_ftready.tiny import build_tokenizer

    image = load("gpu_carry").Image.load(GPU / "gpu-image.toml")
    assert image.python == "3.12" and image.packages["torch"] == "2.11.0" and "pyarrow" in image.fallbacks
    assert not {"datasets", "pyrsistent", "trl", "pytest-ftready"} & set(image.packages)
    config = load("build_models").llama_config(GPU / "smollm2-135m.json", build_tokenizer())
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # SmolLM2-135M's count


def gpu_outputs(out: Path) -> None:
    """What one run on a GPU writes, in the plugin's own formats, for the summary to read (this
    machine has no GPU to make them)."""
    gpu = {"name": "NVIDIA H200", "memory_total_bytes": 150_754_820_096, "capability": "9.0"}
    (out / "run.json").write_text(json.dumps({
        "started": "2026-12-01 10:00:00 UTC", "command": "python3 examples/gpu/ftready_gpu.py run --out o",
        "exit_code": 1, "seconds": 300.0, "nvidia_smi": "ok",
        "install": {"installed": ["pytest-ftready 0.1.0", "datasets 5.2.0"], "present": {"pyarrow": "23.0.0"},
                    "problems": []},
        "build": {"medium_config": "smollm2-135m.json", "medium_parameters": 134515008},
        "probe": {"python": "3.12.3", "executable": "/opt/python3", "plugin_version": "0.1.0",
                  "plugin_file": "/tmp/site/pytest_ftready/__init__.py",
                  "checks": [{"id": "sustained.thermal", "accelerator": "yes", "nightly": True},
                             {"id": "levers.sweep", "accelerator": "yes", "nightly": True}],
                  "machine": {"gpus": [gpu], "torch": {"version": "2.11.0+cu130", "cuda": "13.0", "arch_list": ["sm_90"]},
                              "nvml": {"driver_version": "580.159.04", "cuda_driver_version": "13.0"}, "host": {}}},
        "runs": [{"name": "smollm2-135m", "recipe": "smollm2-135m/recipe.toml", "status": "finished",
                  "exit_code": 1, "seconds": 200.0}]}))

    def case(name, props, child=""):
        return (f'<testcase classname="recipe.toml" name="{name}" time="1.0"><properties>'
                + "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
                + f"</properties>{child}</testcase>")

    (out / "junit-smollm2-135m.xml").write_text("<testsuites><testsuite>" + "".join([
        case("model.step_memory", {"peak_device_allocated[bytes]": 3 << 30, "peak_device_reserved[bytes]": 4 << 30,
                                   "step_tokens_per_s[tokens/s]": 123456.7, "step_tokens[tokens]": 4096,
                                   "step_seconds[s]": 0.0332, "step_trainer": "pytest-ftready engine"}),
        case("model.forecast_error", {"forecast_peak[bytes]": 3.3 * (1 << 30), "measured_peak[bytes]": 3 << 30,
                                      "measured_peak_method": "max_memory_allocated", "forecast_error[share]": 0.1}),
        case("sustained.throughput", {"tokens_per_s_median[tokens/s]": 120000, "tokens_per_s_first_window[tokens/s]":
                                      121000, "tokens_per_s_last_window[tokens/s]": 118000,
                                      "throughput_drop[share]": 0.025}),
        case("sustained.thermal", {"samples[samples]": 140, "max_temperature[C]": 71,
                                   "throttle_reasons": "sw_power_cap from 12 s"}),
        case("levers.sweep[recipe]", {"peak_memory[bytes]": 4 << 30, "tokens_per_s[tokens/s]": 120500}),
        case("levers.sweep[attn=flash_attention_2]", {}, '<skipped message="not available on this device: no flash-attn"/>'),
        case("levers.sweep[attn=eager]", {}, '<failure message="attn = eager runs out of memory on NVIDIA H200"/>'),
    ]) + "</testsuite></testsuites>")
    (out / "benchmark-smollm2-135m.json").write_text(json.dumps({"benchmarks": [
        {"name": "levers.sweep[recipe]", "group": "levers.sweep smollm2-135m",
         "stats": {"mean": 0.034, "min": 0.033, "rounds": 3}}]}))
    arts = out / "artifacts" / "smollm2-135m" / "smollm2-135m"
    arts.mkdir(parents=True)
    (arts / "series.json").write_text(json.dumps({"sustained.throughput": {
        "temperature_c": [[0, 45], [30, 71]], "sm_clock_mhz": [[0, 1980], [30, 1755]], "power_w": [[0, 300], [30, 690]]}}))


def test_the_summary_of_a_gpu_run_shows_its_figures(tmp_path):
    gpu_outputs(tmp_path)
    record = load("gpu_summary").write(tmp_path)
    page = (tmp_path / "summary.md").read_text()
    assert page.startswith("# pytest-ftready GPU run: NVIDIA H200\n") and "No GPU was found" not in page
    for expected in ("580.159.04 (CUDA driver 13.0)", "2.11.0+cu130 (CUDA 13.0", "| 3.00 GiB | 4.00 GiB |",
                     "3.00 GiB (max_memory_allocated) | 3.30 GiB | +10.0% | passed", "123,457 (4096 tokens in 33.2 ms)",
                     "120,000 (121,000 → 118,000) | 2.5%", "| 140 | 45–71 C | 1,755–1,980 MHz | — | 300–690 W | "
                     "sw_power_cap from 12 s | passed |", "| recipe | passed | 4.00 GiB | 120,500 | 34.0 ms | 3 |",
                     "| attn=eager | failed: attn = eager runs out of memory on NVIDIA H200 |",
                     "skipped `levers.sweep` [attn=flash_attention_2]: not available on this device: no flash-attn",
                     "134,515,008 parameters", "- smollm2-135m `levers.sweep[attn=eager]`: attn = eager runs out"):
        assert expected in page, expected
    assert record["gpu_found"] and record["runs"][0]["counts"] == {"passed": 5, "failed": 1, "error": 0, "skipped": 1}


SMALL = {"_source": "the rehearsal's: the 135M-class run's code path at a CPU's size", "model_type": "llama",
         "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024, "max_position_embeddings": 1024,
         "tie_word_embeddings": True, "initializer_range": 0.3}


@pytest.mark.slow  # ~2.5 min: the carry downloaded from the index, four whole pytest runs
def test_the_gpu_script_rehearsed_on_this_cpu(tmp_path):
    script = GPU / "ftready_gpu.py"
    carry = tmp_path / "carry"
    prepared = subprocess.run([sys.executable, str(script), "prepare", "--carry", str(carry)],
                              capture_output=True, text=True)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    manifest = json.loads((carry / "manifest.json").read_text())
    assert manifest["python"] == "3.12" and manifest["fallbacks"] == ["pyarrow"]
    assert {"pytest-ftready", "datasets", "pyrsistent", "trl", "dill", "multiprocess"} <= set(manifest["wheels"])
    assert not {"torch", "transformers", "peft", "pytest", "pytest-benchmark", "pytest-timeout",
                "nvidia-ml-py"} & set(manifest["wheels"])
    files = sorted(p.name for p in (carry / "wheels").iterdir())
    assert files == sorted(w["file"] for w in manifest["wheels"].values())
    carried = sum((carry / "wheels" / f).stat().st_size for f in files)
    assert f"carried wheels {carried / 1048576:.1f} MiB" in prepared.stdout and "prepare: fits" in prepared.stdout

    (tmp_path / "small.json").write_text(json.dumps(SMALL))
    out, bundle = tmp_path / "out", tmp_path / "gpu-run.tar.gz"
    ran = subprocess.run([sys.executable, str(script), "run", "--carry", str(carry), "--out", str(out),
                          "--site", str(tmp_path / "site"), "--medium-config", str(tmp_path / "small.json"),
                          "--bundle", str(bundle)], capture_output=True, text=True)
    # 1: checks failed on this CPU (TRL's CPU step against the engine's forecast)
    assert ran.returncode in (0, 1), ran.stdout[-3000:] + ran.stderr[-3000:]
    record = json.loads((out / "summary.json").read_text())
    assert record["gpu_found"] is False
    assert record["install"]["installed"] == ["pytest-ftready 0.1.0"] and record["install"]["problems"] == []
    assert record["probe"]["plugin_file"].startswith(str(tmp_path / "site"))  # the carried wheel's code ran
    # SMALL's shape: tied embedding 1024 x 64, two layers of q/o 64 x 64, k/v 64 x 32, MLP 3 x 64 x 128, norms
    assert record["build"]["medium_parameters"] == 1024 * 64 + 2 * (2 * 4096 + 2 * 2048 + 3 * 8192 + 128) + 64
    accelerator = {c["id"] for c in record["probe"]["checks"] if c["accelerator"] == "yes"}
    assert {"stack.driver", "stack.arch", "levers.sweep", "sustained.throughput", "sustained.thermal"} <= accelerator
    names = ["tiny", "smollm2-135m", "tiny-trl", "smollm2-135m-trl"]
    assert [r["name"] for r in record["runs"]] == names and {r["status"] for r in record["runs"]} == {"finished"}
    for name in names:
        for made in (f"junit-{name}.xml", f"benchmark-{name}.json", f"pytest-{name}.log"):
            assert (out / made).is_file(), made
        (artifacts,) = (out / "artifacts" / name).iterdir()
        assert {"report.html", "measurements.json", "environment.json"} <= {p.name for p in artifacts.iterdir()}
        found = outcomes(out / f"junit-{name}.xml")
        marked = {c: v for c, v in found.items() if c.split("[")[0] in accelerator}
        assert marked and all(state == "skipped" and "needs a CUDA/ROCm GPU" in why for state, why in marked.values())
        assert found["model.step_memory"][0] == "passed"  # the CPU figures the summary shows are real ones
    nightly = outcomes(out / "junit-smollm2-135m.xml")
    assert "sustained.throughput" in nightly and "levers.sweep[recipe]" in nightly
    assert "sustained.throughput" not in outcomes(out / "junit-tiny-trl.xml")  # TRL runs leave the nightly ones out
    page = (out / "summary.md").read_text()
    assert page.startswith("# pytest-ftready GPU run: no GPU found\n") and "**No GPU was found on this machine.**" in page
    assert "| `sustained.thermal`, `sustained.throughput`, `levers.sweep` [attn=eager, " in page
    assert "needs a CUDA/ROCm GPU" in page and "(weights + live tensor bytes)" in page
    for present in ("nvidia-smi.txt", "run.json", "run.log", "build-models.log", "summary.md"):
        assert (out / present).is_file(), present
    with tarfile.open(bundle) as tar:
        assert "out/summary.md" in tar.getnames() and "out/junit-smollm2-135m.xml" in tar.getnames()
