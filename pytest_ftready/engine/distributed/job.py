"""What the launcher and the ranks share: the job description (``job.json``), the files each
rank writes, and the two test-only hooks. No torch here."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from ...files import ensure_private_dir, write_json

JOB_FILE = "job.json"
WORST_DIR = "worst-batch"  # examples.json of the worst-case batch (engine.checkpoint.load_examples)
TRAIN_DIR = "train-examples"  # examples.json of the resume run
CHECKPOINT_DIR = "checkpoint"  # torch.distributed.checkpoint folder, shared by the run and resume jobs
LOG_DIR = "logs"  # torchrun --log-dir: per-rank stdout/stderr
TORCHRUN_LOG = "torchrun.log"  # the launcher's own output

MODES = ("run", "resume", "reshard")

# Test-only hooks, read by each rank from its environment. They exist so the plugin's own
# tests can make a rank die mid-collective and a rank look small; never set them in a real run.
KILL_RANK_ENV = "FTREADY_TEST_KILL_RANK"  # "RANK:PHASE", e.g. "1:collectives": that rank SIGKILLs itself there
FAKE_CAPACITY_ENV = "FTREADY_TEST_RANK_CAPACITY"  # "RANK=BYTES[,RANK=BYTES]": the capacity that rank reports
JOB_TOKEN_ENV = "FTREADY_DISTRIBUTED_JOB"  # set in every process of a job: how leftovers are found


def rank_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.json"


@dataclass(frozen=True)
class JobSpec:
    """One torchrun job: which recipe, which mode, with which settings. Written as job.json."""

    recipe: str
    mode: str  # run | resume | reshard
    world_size: int  # processes per node
    nnodes: int
    backend: str  # nccl | gloo
    strategy: str  # ddp | fsdp
    device_kind: str  # cuda | rocm | cpu
    timeout_s: float
    pad_id: int
    steps: int  # resume: total steps of the straight run; it saves after steps // 2
    threads: int
    collective_max_bytes: int
    data_dir: str = ""  # the examples and the checkpoint, shared by the jobs of one recipe
    rdzv_endpoint: str = ""
    saved_world_size: int = 0  # reshard: the world size that wrote the checkpoint
    saved_fingerprints: dict = field(default_factory=dict)  # reshard: trainable params as saved

    def write(self, folder: Path) -> Path:
        return write_json(ensure_private_dir(Path(folder)) / JOB_FILE, asdict(self))

    @classmethod
    def read(cls, folder: Path) -> "JobSpec":
        return cls(**json.loads((Path(folder) / JOB_FILE).read_text(encoding="utf-8")))


def fake_capacity(rank: int, environ: Optional[dict] = None) -> Optional[int]:
    """The test-only capacity for ``rank`` from FTREADY_TEST_RANK_CAPACITY, else None."""
    text = (environ if environ is not None else os.environ).get(FAKE_CAPACITY_ENV, "")
    for part in filter(None, (p.strip() for p in text.split(","))):
        which, _, value = part.partition("=")
        if which.strip() == str(rank):
            return int(value)
    return None


def kill_point(rank: int, environ: Optional[dict] = None) -> str:
    """The phase where this rank must die (FTREADY_TEST_KILL_RANK), else ''."""
    text = (environ if environ is not None else os.environ).get(KILL_RANK_ENV, "")
    which, _, phase = text.partition(":")
    return phase if text and which.strip() == str(rank) else ""


def save_examples(folder: Path, examples: Any) -> Path:
    """Examples in engine.checkpoint's examples.json layout, so load_examples reads them."""
    from ..checkpoint import EXAMPLES_FILE

    folder = ensure_private_dir(Path(folder))
    write_json(folder / EXAMPLES_FILE, [[list(e.input_ids), list(e.labels)] for e in examples])
    return folder
