"""One pass over the training files in bounded memory: chunks in file order, each read (and
encoded) into a ``digest.DataDigest``, merged in order. With enough data, and an encoder that
can travel to another process (the built-in one), chunks are read and encoded in worker
processes; the merge keeps the order, so the digest is the same for 1 or N workers.

Workers are started with ``spawn`` (never ``fork`` a process that may hold torch threads),
ignore Ctrl-C (the main process stops them), and are stopped when the pass ends, fails or
is interrupted. Imports no torch."""

from __future__ import annotations

import os
import sys
import types
from collections import deque
from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Iterable, Optional, Sequence

from .meter import Meter
from .digest import DataDigest, Encode, Plan, digest_chunk
from .rows import CHUNK_BYTES, chunks, total_bytes

# below this much data one process does the pass: starting a worker costs seconds
# (the privacy scan runs at ~250 MB/s a core and two workers take ~0.7 s to start: they pay off
# from ~400 MB of files)
PARALLEL_MIN_BYTES = {"encode": 16 * 2**20, "read": 256 * 2**20, "scan": 512 * 2**20}
PER_WORKER_BYTES = 4 * CHUNK_BYTES  # a worker is worth starting for this much data
IN_FLIGHT = 2  # chunks queued per worker


def cpu_count() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def workers_for(requested: Optional[int], files: Sequence, encoding: bool, work: Optional[str] = None) -> int:
    """``requested`` (--ftready-workers) if given, else, when the files are large enough for
    workers to pay off, one per CPU with at least PER_WORKER_BYTES of data each; else 1.
    ``work``: a key of PARALLEL_MIN_BYTES ("encode" or "read" by ``encoding`` if None)."""
    if requested:
        return requested
    size = total_bytes(files)
    if size < PARALLEL_MIN_BYTES[work or ("encode" if encoding else "read")]:
        return 1
    return max(1, min(cpu_count(), size // PER_WORKER_BYTES))


def encode_with(encoder, pairs: list) -> list:
    """The built-in encoder over [(row, sample)]: what a worker (or this process) runs."""
    return encoder.encode_many(pairs)


class PassFailed(RuntimeError):
    """A worker process died (killed, out of memory) before its chunk was done."""


def run_pass(files: Sequence, plan: Plan, *, encode: Encode = None, encoder=None, workers: int = 1,
             progress: Optional[Callable[[str], None]] = None, chunk_bytes: int = CHUNK_BYTES) -> DataDigest:
    """The digest of every row of ``files``. ``encode``: [(row, sample)] -> Encoded, or None to only
    read and shape rows; ``encoder``: the built-in encoder, which worker processes can use
    (``encode`` then defaults to it). A pipeline that cannot travel runs in this process."""
    if encoder is not None and encode is None:
        encode = partial(encode_with, encoder)
    digest = DataDigest(plan, encoding=encode is not None)
    meter = Meter("data: encoded" if encode is not None else "data: read", total_bytes(files), progress)
    if workers > 1 and (encode is None or encoder is not None):
        return _in_workers(files, plan, encoder, encode is not None, workers, meter, digest, chunk_bytes)
    for chunk in chunks(files, chunk_bytes):
        digest.merge(digest_chunk(chunk, plan.narrowed(digest), encode))
        meter.update(chunk.size, digest.total)
    return digest


def _in_workers(files, plan: Plan, encoder, encoding: bool, workers: int, meter: Meter, digest: DataDigest,
                chunk_bytes: int) -> DataDigest:
    def done(result: DataDigest, size: int) -> None:
        digest.merge(result)
        meter.update(size, digest.total)

    # a generator: each chunk's plan is narrowed by the digests merged before it is sent
    tasks = ((_digest_in_worker, (chunk, plan.narrowed(digest), encoding), chunk.size)
             for chunk in chunks(files, chunk_bytes))
    in_order(tasks, workers, done, "reading the training data", encoder,
             remedy="run with --ftready-workers=1 to read in one process")
    return digest


def in_order(tasks: Iterable[tuple[Callable, tuple, int]], workers: int, done: Callable[[Any, int], None],
             doing: str, encoder=None, remedy: str = "run with --ftready-workers=1 to work in one process") -> None:
    """Run each (function, args, size) of ``tasks`` in ``workers`` spawned processes, at most
    IN_FLIGHT per worker queued, and hand each result with its size to ``done`` in the order
    of ``tasks``. ``function`` must be importable by a worker; ``encoder`` reaches the workers
    once, at their start. A dying worker is a ``PassFailed`` naming what it was ``doing`` and
    the ``remedy``."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(encoder,))
    pending: deque = deque()

    def first_done() -> None:
        future, size, started = pending.popleft()
        result = future.result()
        if not started:  # not a start-up task's pid
            done(result, size)

    try:
        with _bare_main():  # the workers start now, each on its first task
            pending.extend((pool.submit(os.getpid), 0, True) for _ in range(workers))
        for function, args, size in tasks:
            pending.append((pool.submit(function, *args), size, False))
            while len(pending) >= IN_FLIGHT * workers:
                first_done()
        while pending:
            first_done()
    except BrokenProcessPool:
        raise PassFailed(f"a worker process {doing} died (killed, or out of memory) with "
                         f"{workers} workers: {remedy}") from None
    finally:
        _stop(pool)


@contextmanager
def _bare_main():
    """A spawned worker imports the starting program's ``__main__`` again unless it has neither
    a spec nor a file: a script without an ``if __name__ == "__main__"`` guard (pytest.main()
    called from a script) would run again in each worker, code read from stdin cannot be found.
    While the workers start, ``__main__`` is an empty module."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _stop(pool) -> None:
    """Stop the workers now: queued chunks are dropped, running ones killed (their results are
    not wanted when the pass ends early; after a whole pass they are idle)."""
    pool.shutdown(wait=False, cancel_futures=True)
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive():
            process.terminate()
        process.join(timeout=5)


_ENCODER = None  # the worker's built-in encoder, from the initializer


def _start_worker(encoder) -> None:
    import multiprocessing
    import signal
    import threading

    global _ENCODER
    _ENCODER = encoder
    # the workers already take every CPU: a tokenizer's own batch threads in each would only contend
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    parent = multiprocessing.parent_process()
    if parent is not None:  # a worker outlives no killed main process (it would wait on its queue forever)
        threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent) -> None:
    from multiprocessing.connection import wait

    wait([parent.sentinel])
    os._exit(1)


def _digest_in_worker(chunk, plan: Plan, encoding: bool) -> DataDigest:
    return digest_chunk(chunk, plan, partial(encode_with, _ENCODER) if encoding else None)
