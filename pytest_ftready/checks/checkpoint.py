"""Checkpoint download checks: the revision is a commit, only the needed files are fetched,
and they fit on the disk that will hold them."""

from __future__ import annotations

from pathlib import Path

from ..machine.compatibility import config_value
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
        raise Fail(f"no loadable weights among {sorted(sizes)[:10]}: the model needs *.safetensors (or "
                   f"pytorch_model*.bin)")
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
    snapshot = _snapshot(recipe, found)
    if not snapshot.is_dir():
        raise Skip(f"not downloaded yet; fetch only what is needed: huggingface_hub.snapshot_download("
                   f"'{recipe.model.id}', revision='{found.sha}', allow_patterns={needed})")
    missing = [f for f in needed if not (snapshot / f).exists()]
    if missing:
        raise Fail(f"the cached snapshot {snapshot} lacks {', '.join(missing)}: run snapshot_download("
                   f"'{recipe.model.id}', revision='{found.sha}', allow_patterns={needed})")


def _snapshot(recipe, found) -> Path:
    return repo_cache_dir(recipe.model.id) / "snapshots" / found.sha


# Where a token's untrained row hurts, by where it is used.
USED_BY = {"template": "the chat template writes it", "stop": "training teaches it as the stop token",
           "data": "the data holds it"}


def _used_special_tokens(ctx) -> dict[int, tuple[str, set]]:
    """id -> (text, {template, stop, data}): the special and added tokens the chat template writes
    (a system/user/assistant conversation and the generation prompt), the stop tokens the labels
    train, and those in the data's first rows as the recipe's pipeline encodes them."""
    state = ctx.state
    tokenizer = state.tokenizer
    special = set(tokenizer.all_special_ids) | {int(i) for i in tokenizer.added_tokens_decoder}
    used: dict[int, tuple[str, set]] = {}

    def add(ids, where: str) -> None:
        for token_id in set(ids) & special:
            used.setdefault(token_id, (tokenizer.convert_ids_to_tokens(token_id), set()))[1].add(where)

    add(state.stop_ids, "stop")
    encoder = state.encoder
    if ctx.recipe.data.format == "messages":
        turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
        for messages in ([{"role": "system", "content": "Be brief"}, *turns], turns):
            try:
                text = encoder.render(messages) + encoder.render(messages[:-1], add_generation_prompt=True)
            except Exception:  # a template that refuses a system turn (raise_exception): try without one
                continue
            add(tokenizer(text, add_special_tokens=encoder.add_special)["input_ids"], "template")
            break
    rows = state.rows.usable_rows
    for encoded in (encoder.encode(row) for row in rows):
        add(encoded.input_ids, "data")
    ctx.measure("token_rows_data_rows", len(rows), "rows")
    return used


@check("checkpoint.token_rows", stage=STAGES["checkpoint"] + 3, requires=("checkpoint.files",))
def token_rows(ctx) -> None:
    """The embedding (and untied LM-head) rows of the chat tokens the template, the stop and the data
    use are trained."""
    from ..engine.loading import model_config
    from ..engine.token_rows import HEAD_NAMES, HIGH, LOW, NoWeights, judge

    recipe = ctx.recipe
    if recipe.model.gguf_file:
        raise Skip(f"gguf_file = \"{recipe.model.gguf_file}\": the rows are read from safetensors weights only")
    folder = Path(recipe.model.path) if recipe.model.path else _snapshot(recipe, ctx.state.model_files)
    if not folder.is_dir():
        raise Skip(f"{recipe.model.id} is not downloaded yet (checkpoint.files names what to fetch): its weights "
                   "cannot be read")
    used = _used_special_tokens(ctx)
    ctx.measure("chat_tokens", ", ".join(text for text, _ in sorted(used.values())), "")
    config = model_config(recipe)
    try:
        rows = judge(folder, {i: text for i, (text, _) in used.items()}, config_value(config, "vocab_size"),
                     config_value(config, "tie_word_embeddings"))
    except NoWeights as exc:
        raise Skip(str(exc)) from None
    ctx.measure("token_rows_checked", rows.checked, "tokens")
    for name, (file, vocabulary, median) in rows.matrices.items():
        role = "lm_head" if any(k in name for k in HEAD_NAMES) else "embedding"
        ctx.measure(f"{role}_tensor", f"{name} ({file})", "")
        ctx.measure(f"{role}_median_row_norm", median, "")
        ctx.measure(f"{role}_vocabulary_rows", vocabulary, "rows")
    if not rows.bad:
        return
    files = ", ".join(sorted({f"{file} ({name}, median row norm {median:.3g})"
                              for name, (file, _, median) in rows.matrices.items()}))
    named = "; ".join(f"{bad.token!r} (id {bad.token_id}, {bad.matrix}: norm {bad.norm:.3g}, {bad.why}; "
                      f"{', '.join(text for w, text in USED_BY.items() if w in used[bad.token_id][1])})"
                      for bad in rows.bad)
    tokens = sorted({bad.token_id for bad in rows.bad})
    raise Fail(f"{len(tokens)} of {rows.checked} chat token(s) have untrained rows in {files}, judged against the "
               f"vocabulary (a row below {LOW:g} or above {HIGH:g} x the median norm): {named}. Untrained chat tokens "
               "give NaN losses or a model that never stops (unsloth #658, axolotl #1666). Fix: initialise these rows "
               "to the mean of the trained rows before training, train the embeddings (peft modules_to_save = "
               "[\"embed_tokens\", \"lm_head\"] or trainable_token_indices; Axolotl's lora_modules_to_save), or "
               "start from the instruct model, whose chat tokens are trained")


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
