"""Checkpoint download checks: the revision is a commit, only the needed files are fetched,
and they fit on the disk that will hold them."""

from __future__ import annotations


from ..machine.hub import duplicates, needed_files, repo_cache_dir
from ..recipe.schema import is_commit_hash
from ..units import human_bytes
from ..outcomes import Fail, Skip
from .registry import STAGES, check


@check("checkpoint.revision", stage=STAGES["checkpoint"])
def revision(ctx) -> None:
    """A hub model's revision resolves to a commit; a branch or tag is reported with today's commit."""
    recipe = ctx.recipe
    if recipe.model.path:
        raise Skip("a local model folder has no hub revision (repro.pins records its content hash)")
    files = ctx.state.model_files
    ctx.measure("resolved_commit", files.sha, "")
    if not is_commit_hash(recipe.model.revision):
        raise Fail(f"revision {recipe.model.revision!r} is a branch or tag; today it points to {files.sha}: "
                   f"write revision = \"{files.sha}\" so every run trains on the same weights")
    if files.sha != recipe.model.revision:
        raise Fail(f"revision {recipe.model.revision} resolved to {files.sha} ({files.source})")


@check("checkpoint.files", stage=STAGES["checkpoint"] + 1)
def files(ctx) -> None:
    """Only the files this recipe needs (config, tokenizer, safetensors), and the snapshot holds them all."""
    recipe = ctx.recipe
    found = ctx.state.model_files
    sizes = found.sizes
    needed = needed_files(sizes, recipe.model.gguf_file)
    extra = duplicates(sizes, needed)
    ctx.measure("allow_patterns", ", ".join(needed), "")
    ctx.measure("file_list_source", found.source, "")
    ctx.measure("files_listed", len(sizes), "files")
    ctx.measure("needed_files", len(needed), "files")
    ctx.measure("duplicate_weight_files", len(extra), "files")
    if recipe.model.gguf_file and recipe.model.gguf_file not in sizes:
        raise Fail(f"gguf_file {recipe.model.gguf_file!r} is not among the model's files {sorted(sizes)[:10]}")
    if not any(f.endswith((".safetensors", ".bin", ".gguf")) for f in needed):
        raise Fail(f"no loadable weights among {sorted(sizes)[:10]}: the model needs *.safetensors (or pytorch_model*.bin)")
    if "config.json" not in needed and not recipe.model.gguf_file:
        raise Fail("config.json is missing from the model's files")
    if recipe.model.path:
        if extra:
            wasted = sum(sizes[f] or 0 for f in extra)
            ctx.measure("duplicate_weight_bytes", wasted, "bytes")
        absent = [f for f in needed if sizes[f] is None]
        if absent:
            raise Fail(f"the model folder {recipe.model.path} lacks {', '.join(absent)}, named by its weight index: "
                       "copy the missing shard(s) from where the model came from")
        return
    snapshot = repo_cache_dir(recipe.model.id) / "snapshots" / found.sha
    if not snapshot.is_dir():
        raise Skip(f"not downloaded yet; fetch only what is needed: huggingface_hub.snapshot_download("
                   f"'{recipe.model.id}', revision='{found.sha}', allow_patterns={needed})")
    missing = [f for f in needed if not (snapshot / f).exists()]
    if missing:
        raise Fail(f"the cached snapshot {snapshot} lacks {', '.join(missing)}: run snapshot_download("
                   f"'{recipe.model.id}', revision='{found.sha}', allow_patterns={needed})")


@check("checkpoint.disk", stage=STAGES["checkpoint"] + 2)
def disk(ctx) -> None:
    """The needed files, plus the budget's disk headroom, fit on the disk that will hold them."""
    recipe, state = ctx.recipe, ctx.state
    found = ctx.state.model_files
    sizes = found.sizes
    needed = needed_files(sizes, recipe.model.gguf_file)
    unknown = [f for f in needed if sizes[f] is None]
    if unknown:
        raise Skip(f"no size known for {', '.join(unknown)} (the file list came from the {found.source}"
                   + (", where they are missing)" if found.source == "cache" else ")"))
    total = sum(sizes[f] for f in needed)
    ctx.measure("model_bytes", total, "bytes")
    if recipe.model.path:
        return  # already on disk: nothing to download
    target = repo_cache_dir(recipe.model.id)
    snapshot = target / "snapshots" / found.sha
    to_fetch = sum(sizes[f] for f in needed if not (snapshot / f).exists())
    free = state.run.disk_free(target)
    headroom = recipe.budget.disk_headroom
    ctx.measure("bytes_to_download", to_fetch, "bytes")
    ctx.measure("disk_free", free, "bytes")
    if to_fetch > free * (1 - headroom):
        raise Fail(f"downloading {human_bytes(to_fetch)} of {recipe.model.id} needs more than the "
                   f"{human_bytes(free * (1 - headroom))} usable on {target.parent} ({human_bytes(free)} free less "
                   f"the {headroom:.0%} disk_headroom): free space or point HF_HOME at a larger disk")
