"""The GPU run of pytest-ftready: every accelerator and nightly check, on an NVIDIA GPU machine
that has no network, with one output folder and a one-page summary.

Two steps:

    python examples/gpu/ftready_gpu.py prepare     # here, where the package index is reachable
    python3 examples/gpu/ftready_gpu.py run --out gpu-run     # there, from a copy of this checkout

``prepare`` builds the plugin's wheel from this checkout and downloads, for the GPU machine's
Python and platform (``gpu-image.toml``: what its image already has), the wheels of what it
lacks: datasets, pyrsistent, TRL and their own needs (dill, multiprocess), and a fallback
pyarrow for datasets (installed there only if the machine's own is too old). They go to
``examples/gpu/carry/`` (git-ignored) with a ``manifest.json`` saying why each is carried; it
then prints the carried bytes plus the working tree that travels beside them against the 64 MiB
a GPU machine is sent, and what to copy another way when that is exceeded (exit 1).

``run`` (standard library only until the wheels are in):

1. records ``nvidia-smi -q`` (``nvidia-smi.txt``);
2. installs, with ``pip install --no-index --no-deps --target SITE``, the plugin's wheel and each
   carried wheel the machine lacks or has in a version the others do not accept, then lists
   every requirement of what it installed that the machine still does not meet;
3. builds the models there (``build_models.py``): the tiny example, and a SmolLM2-135M-shaped
   Llama (``smollm2-135m.json``: 30 layers, hidden 576, vocabulary 49,152, 134.5M parameters)
   with seeded random weights, saved in bfloat16, trained by ``smollm2-135m.toml`` (bfloat16,
   SDPA, LoRA r16 on every linear layer, micro-batch 8 x 512 tokens, a 70 s sustained window);
4. runs pytest once per run, each in a process of its own so that one model's memory never
   counts in another's CUDA peak: ``tiny`` and ``smollm2-135m`` with ``--ftready-nightly``
   (every check: the accelerator ones, the lever sweep with its attention kernels, the sustained
   window with NVML telemetry, the memory forecast against the measured CUDA step), and, where
   TRL is installed, ``tiny-trl`` and ``smollm2-135m-trl`` (TRL's own SFTTrainer for the step,
   overfit and resume; the nightly checks are the engine's and ran already);
5. writes the summary (``summary.md``, one page: GPU, driver, torch build; peak allocated and
   reserved; tokens/s; the forecast's error against the measured peak; temperatures, clocks,
   throttle reasons; the lever and kernel sweep) and ``summary.json`` from the outputs.

The output folder holds ``junit-<run>.xml``, ``benchmark-<run>.json`` (pytest-benchmark),
``pytest-<run>.log``, ``artifacts/<run>/<recipe>/`` (the plugin's report.html, measurements.json,
series.json, environment.json, ...), ``nvidia-smi.txt``, ``run.json`` (what this script did),
``run.log`` and the summary; ``--bundle FILE.tar.gz`` packs it into one file. Exit 0: every run
finished and no check failed; 1: a check failed (see the summary); 2: a run could not finish
(install, model build, a crash or a time limit). Without a GPU it runs the same way: the
accelerator and nightly checks skip with their reasons and the summary says that no GPU was found.

On a machine lent for a few minutes, which sends back a handful of files: from the repository
root, with ``examples/gpu/carry`` sent along, ``python3 examples/gpu/ftready_gpu.py run --out
/tmp/gpu-run --deadline-s 540 --bundle $OUT/gpu-run.tar.gz; cp /tmp/gpu-run/summary.md $OUT/``
(expected to take about 5 minutes on an H200 from the recipes' settings; not measured yet). ``--runs smollm2-135m``
reruns one run only; ``summary OUT`` writes the summary of an output folder again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import gpu_carry as carry  # noqa: E402  (beside this file)
import gpu_summary as summary  # noqa: E402

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "PYTHONUNBUFFERED": "1"}
MEDIUM = "smollm2-135m"
# name -> (folder under the work folder, the file --ftready reads, with --ftready-nightly, needs TRL)
RUNS = {
    "tiny": ("tiny", "recipe.toml", True, False),
    MEDIUM: (MEDIUM, "recipe.toml", True, False),
    "tiny-trl": ("tiny", "trl-sft.yaml", False, True),
    f"{MEDIUM}-trl": (MEDIUM, f"{MEDIUM}-trl.yaml", False, True),
}
SITE_MARK = ".ftready-gpu-site"
RESERVE_S = 20  # kept for the summary and the bundle at the deadline
SHORTEST_RUN_S = 30  # a run is not started with less time than this left


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, line: str) -> None:
        print(f"ftready_gpu: {line}", flush=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")


# ---- prepare -----------------------------------------------------------------------------------------
def cmd_prepare(args) -> int:
    image = carry.Image.load(args.image)
    if args.python_version:
        image = carry.Image(args.python_version, image.platforms, image.packages, image.fallbacks)
    made = carry.prepare(REPO, args.carry, image, extras=() if args.no_trl else ("trl",), also=tuple(args.also),
                         fallbacks=not args.no_fallbacks)
    for name, why in sorted(made.present.items()):
        print(f"prepare: not carried, {name}: {why}")
    fits, lines = carry.size_report(args.carry, REPO)
    print("\n".join(f"prepare: {line}" for line in lines))
    print(f"prepare: {'fits' if fits else 'does NOT fit'}; on the GPU machine: python3 examples/gpu/ftready_gpu.py run "
          f"(with {args.carry} beside the script)")
    return 0 if fits else 1


# ---- probe (a subprocess, in the environment the runs get) --------------------------------------------
def cmd_probe(args) -> int:
    """Print what the runs will see: the plugin's own machine probe, where the plugin and TRL come
    from, and which checks are marked accelerator or nightly."""
    import dataclasses

    import pytest_ftready
    from pytest_ftready.checks.registry import all_checks
    from pytest_ftready.machine.probes import installed, read_machine

    machine = read_machine()
    checks = [{"id": spec.id, "accelerator": "yes" if spec.accelerator is True else ("GPU recipes" if spec.accelerator
                                                                                    else ""), "nightly": spec.nightly}
              for spec in all_checks() if spec.accelerator or spec.nightly]
    print(json.dumps({"machine": dataclasses.asdict(machine), "python": sys.version.split()[0],
                      "executable": sys.executable, "plugin_file": pytest_ftready.__file__,
                      "plugin_version": installed("pytest-ftready"), "trl": installed("trl"),
                      "checks": checks}, default=str))
    return 0


# ---- run ---------------------------------------------------------------------------------------------
def prepare_site(site: Path) -> None:
    """An empty install target, or one this script made before (never someone else's folder)."""
    if site.exists() and any(site.iterdir()) and not (site / SITE_MARK).exists():
        raise SystemExit(f"ftready_gpu: --site {site} is not empty and was not made by this script; "
                         "give an empty or new folder")
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    (site / SITE_MARK).write_text("made by examples/gpu/ftready_gpu.py run; removed and remade by each run\n")


def nvidia_smi(out: Path) -> str:
    """``nvidia-smi -q`` into nvidia-smi.txt; returns one line for the summary."""
    found = shutil.which("nvidia-smi")
    if not found:
        (out / "nvidia-smi.txt").write_text("nvidia-smi: not found on PATH\n")
        return "not found on PATH"
    result = subprocess.run([found, "-q"], capture_output=True, text=True, timeout=60)
    (out / "nvidia-smi.txt").write_text(result.stdout + result.stderr)
    return "ok" if result.returncode == 0 else f"exit {result.returncode}: {(result.stderr or result.stdout).strip()[:200]}"


def run_subprocess(command: list, cwd: Path, env: dict, log_path: Path, timeout_s: float) -> tuple[str, int]:
    """(status, exit code): 'finished', or 'timed out' after ``timeout_s`` (its process group killed)."""
    with log_path.open("w", encoding="utf-8") as handle:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            return "finished", process.wait(timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return f"timed out after {timeout_s:.0f} s", process.returncode
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            raise


def cmd_run(args) -> int:
    started = time.time()
    deadline = started + args.deadline_s if args.deadline_s else None
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    for stale in ("run.log", "summary.md", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    log = Log(out / "run.log")
    record = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
              "command": " ".join(["python3", "examples/gpu/ftready_gpu.py", *sys.argv[1:]]), "runs": [],
              "exit_code": 2}

    def finish(code: int) -> int:
        record["exit_code"], record["seconds"] = code, round(time.time() - started, 1)
        (out / "run.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        summary.write(out)
        if args.bundle:
            bundle = Path(args.bundle).resolve()
            bundle.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(bundle, "w:gz") as tar:  # never the bundle itself, where it lies inside
                tar.add(out, arcname=out.name, filter=lambda i: None if i.name.endswith(bundle.name) else i)
            log(f"bundled {out} into {bundle} ({summary.size(bundle.stat().st_size)})")
        log(f"done in {record['seconds']:.0f} s, exit {code}: {out / 'summary.md'}")
        return code

    record["nvidia_smi"] = nvidia_smi(out)
    log(f"nvidia-smi: {record['nvidia_smi']}")

    # 2. install what the machine lacks, from the carry
    site = args.site.resolve()
    prepare_site(site)
    plan = carry.plan_install(args.carry)
    record["install"] = {"site": str(site), "installed": plan.names(), "present": plan.present,
                         "problems": plan.problems}
    if not plan.install:
        log(f"nothing to install: {'; '.join(plan.problems)}")
        return finish(2)
    try:
        carry.install(plan, site, log)
    except subprocess.CalledProcessError as error:
        record["install"]["problems"] = plan.problems + [f"pip install failed: exit {error.returncode}"]
        return finish(2)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    extras = json.loads((args.carry / carry.MANIFEST).read_text()).get("extras", [])
    record["install"]["problems"] = plan.problems + carry.unmet(plan.dists(), extras)
    for problem in record["install"]["problems"]:
        log(f"environment: {problem}")
    env = {**os.environ, **OFFLINE,
           "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}

    # what the runs will see
    probe = subprocess.run([sys.executable, __file__, "probe"], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        record["probe_error"] = probe.stderr.strip()[-2000:]
        log(f"the plugin does not import from {site}: {probe.stderr.strip().splitlines()[-1:]}")
        return finish(2)
    record["probe"] = json.loads(probe.stdout.strip().splitlines()[-1])
    gpus = record["probe"]["machine"]["gpus"]
    log(f"GPU: {', '.join(g['name'] for g in gpus) if gpus else 'none found'}; plugin from "
        f"{record['probe']['plugin_file']}")

    # 3. the models, built here
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="ftready-gpu-"))
    work.mkdir(parents=True, exist_ok=True, mode=0o700)
    (work / "pytest.ini").write_text("[pytest]\n# the runs' own folder: no ini file of a folder above applies\n")
    build = [sys.executable, str(HERE / "build_models.py"), str(work)]
    if args.medium_config:
        build += ["--config", str(args.medium_config.resolve())]
    status, code = run_subprocess(build, work, env, out / "build-models.log", time_left(deadline, 600))
    if status != "finished" or code != 0:
        record["build"] = f"{status}, exit {code}: see build-models.log"
        log(f"building the models {record['build']}")
        return finish(2)
    record["build"] = json.loads((out / "build-models.log").read_text().strip().splitlines()[-1])
    log(f"models built in {work}: {MEDIUM} has {record['build']['medium_parameters']:,} parameters")

    # 4. one pytest session per run
    worst = 0
    for name in args.runs:
        folder, target, nightly, needs_trl = RUNS[name]
        entry = {"name": name, "recipe": f"{folder}/{target}", "nightly": nightly}
        record["runs"].append(entry)
        if needs_trl and not record["probe"]["trl"]:
            entry["status"] = "left out: TRL is not installed (prepare carries it unless --no-trl)"
            continue
        left = time_left(deadline, args.run_timeout_s)
        if left < SHORTEST_RUN_S:
            entry["status"] = f"left out: {left:.0f} s were left before --deadline-s"
            worst = 2
            continue
        for stale in (f"junit-{name}.xml", f"benchmark-{name}.json", f"pytest-{name}.log"):
            (out / stale).unlink(missing_ok=True)  # never read an earlier invocation's figures as this one's
        shutil.rmtree(out / "artifacts" / name, ignore_errors=True)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", f"--ftready={target}",
                   f"--ftready-artifacts={out / 'artifacts' / name}", f"--junitxml={out / f'junit-{name}.xml'}",
                   f"--benchmark-json={out / f'benchmark-{name}.json'}", *(["--ftready-nightly"] if nightly else [])]
        entry["command"] = " ".join(["python", "-m", *command[2:]])
        log(f"run {name}: {entry['command']}")
        began = time.time()
        status, code = run_subprocess(command, work / folder, env, out / f"pytest-{name}.log", left)
        entry.update(status=status, exit_code=code, seconds=round(time.time() - began, 1))
        completed = status == "finished" and code in (0, 1)
        if not completed and status == "finished":
            entry["status"] = f"pytest stopped with exit {code} (see pytest-{name}.log)"
        worst = max(worst, code if completed else 2)
        log(f"run {name}: {entry['status']}, exit {code}, {entry['seconds']:.0f} s")
    if not args.keep_work and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return finish(worst)


def time_left(deadline, cap: float) -> float:
    return cap if deadline is None else min(cap, deadline - time.time() - RESERVE_S)


def cmd_summary(args) -> int:
    summary.write(args.out)
    print(args.out / "summary.md")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ftready_gpu.py", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    default_carry = HERE / "carry"

    prep = sub.add_parser("prepare", help="build the plugin's wheel and download what the GPU machine lacks")
    prep.add_argument("--carry", type=Path, default=default_carry, help="where the wheels go (default: %(default)s)")
    prep.add_argument("--image", type=Path, default=HERE / "gpu-image.toml", help="what the GPU machine has")
    prep.add_argument("--python-version", help="the GPU machine's Python, e.g. 3.12 (default: the image's)")
    prep.add_argument("--also", action="append", default=[], metavar="SPEC",
                      help="carry this requirement too, e.g. 'pyarrow>=24' (repeatable)")
    prep.add_argument("--no-fallbacks", action="store_true", help="leave out the image's fallback wheels (pyarrow)")
    prep.add_argument("--no-trl", action="store_true", help="carry no TRL (its runs are then left out)")
    prep.set_defaults(func=cmd_prepare)

    run = sub.add_parser("run", help="install from the carry, build the models, run the checks, write the summary")
    run.add_argument("--carry", type=Path, default=default_carry, help="the prepared wheels (default: %(default)s)")
    run.add_argument("--out", type=Path, required=True, help="the output folder")
    run.add_argument("--work", help="where the models are built (default: a new temporary folder, removed after)")
    run.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    run.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / "ftready-gpu-site",
                     help="where the carried wheels are installed (default: %(default)s)")
    run.add_argument("--runs", type=lambda s: [r.strip() for r in s.split(",") if r.strip()], default=list(RUNS),
                     help=f"comma-separated, of {', '.join(RUNS)} (default: all)")
    run.add_argument("--medium-config", type=Path, help=f"the {MEDIUM} model's shape (default: {MEDIUM}.json)")
    run.add_argument("--deadline-s", type=float, help="stop starting runs so that everything ends within this")
    run.add_argument("--run-timeout-s", type=float, default=900, help="the longest one run may take (default 900)")
    run.add_argument("--bundle", help="also pack the output folder into this .tar.gz")
    run.set_defaults(func=cmd_run)

    again = sub.add_parser("summary", help="write summary.md and summary.json of an output folder again")
    again.add_argument("out", type=Path)
    again.set_defaults(func=cmd_summary)

    sub.add_parser("probe", help=argparse.SUPPRESS).set_defaults(func=cmd_probe)
    args = parser.parse_args(argv)
    unknown = [r for r in getattr(args, "runs", []) if r not in RUNS]
    if unknown:
        parser.error(f"--runs: unknown {', '.join(unknown)}; expected some of {', '.join(RUNS)}")
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
