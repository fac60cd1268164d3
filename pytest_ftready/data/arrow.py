"""The training examples as an Arrow file on disk, written chunk by chunk: what the
``ftready_dataset`` fixture opens (memory-mapped) as a ``datasets.Dataset``, so a team's test
can read every example without the session holding the rows in memory.

The rows go through the same chunked reading, layout checks and pipeline as the data pass
(``digest.digest_chunk``); an example is written when it is trainable, the same rule the
checks train by (``Encoded.trainable``). Imports pyarrow, never torch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from .digest import Plan, digest_chunk, marking
from .rows import CHUNK_BYTES, chunks

COLUMNS = ("input_ids", "attention_mask", "labels", "where")  # `where`: file:line of the row


def _schema():
    import pyarrow as pa

    ids = pa.list_(pa.int64())
    return pa.schema([("input_ids", ids), ("attention_mask", pa.list_(pa.int8())), ("labels", ids),
                      ("where", pa.string())])


def write_examples(files: Sequence, plan: Plan, encode: Callable[[list], list], path: Path,
                   chunk_bytes: int = CHUNK_BYTES) -> int:
    """Write every trainable example of ``files`` to ``path`` (Arrow IPC stream, the format
    ``datasets.Dataset.from_file`` maps); one record batch per chunk. Returns the examples written."""
    import pyarrow as pa

    written = 0
    schema = _schema()
    # keep (almost) no samples: the examples pass through memory one chunk at a time
    bare = replace(plan, sample=0, keep_rows=0, keep_first=0, keep_longest=1, reserved=())
    encode = marking(encode, plan.reserved)  # before _keep sees them: the trainable rule the checks use
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for chunk in chunks(files, chunk_bytes):
            batch: list = []
            digest_chunk(chunk, bare, lambda pairs: _keep(encode(pairs), batch))
            if batch:
                writer.write_batch(pa.RecordBatch.from_pydict(dict(zip(COLUMNS, map(list, zip(*batch)))),
                                                              schema=schema))
                written += len(batch)
    return written


def _keep(encoded: list, batch: list) -> list:
    """Collect the trainable ones of ``encoded`` as columns; hand ``encoded`` on unchanged."""
    for e in encoded:
        if e.trainable:
            batch.append((list(e.input_ids), [1] * e.length, list(e.labels), e.row.where))
    return encoded

