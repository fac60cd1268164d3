"""Data checks: rows, chat template, loss masking, lengths, packing, the data loader."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from ..data.encoding import render_example
from ..data.token_view import token_view
from ..outputs.report import masking_page
from ..files import write_private
from ..units import percentile
from ..data.rows import row_problems
from ..data.scan import redact
from ..outcomes import Fail, Skip
from .registry import STAGES, check

# Problems that make a row unusable for training (the model checks leave such rows out).
BLOCKING = frozenset({"render_error", "markers_empty", "truncated_all", "no_supervised"})
TEMPLATE_KINDS = ("render_error", "prompt_not_prefix", "history_rewritten", "bos_doubled")
MASKING_KINDS = ("markers_empty", "assistant_untrained", "wrong_role_trained", "stop_untrained", "no_supervised",
                 "truncated_all")
MAX_LISTED = 10


def where_list(places: list[str]) -> str:
    """'train.jsonl:3, train.jsonl:9 and 12 more'."""
    shown = ", ".join(places[:MAX_LISTED])
    return shown + (f" and {len(places) - MAX_LISTED} more" if len(places) > MAX_LISTED else "")


def summarize(found: dict[str, list[tuple[str, str]]]) -> str:
    """kind -> [(where, detail)] as one paragraph per kind: count, first detail, rows."""
    parts = []
    for kind, hits in found.items():
        parts.append(f"{kind} in {len(hits)} row(s): {hits[0][1]} [{where_list([w for w, _ in hits])}]")
    return "\n".join(parts)


def problems_by_kind(encoded: Iterable, kinds: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    wanted = set(kinds)
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for enc in encoded:
        for kind, detail in enc.problems:
            if kind in wanted:
                found[kind].append((enc.row.where, detail))
    return dict(found)


def encoded_rows(ctx, purpose: str) -> list:
    """The encoded rows, or a failure that says why there are none."""
    try:
        encoded = ctx.state.encoded
    except ValueError as exc:  # no chat template, slow tokenizer, unknown stop token
        raise Fail(str(exc)) from None
    if not encoded:
        raise Fail(f"no well-formed row to {purpose} (see data.format)")
    return encoded


def padding_waste(lengths: list[int], micro_batch: int) -> float:
    """Share of pad tokens when batches of ``micro_batch`` rows are padded to their longest."""
    total = padded = 0
    for start in range(0, len(lengths), micro_batch):
        batch = lengths[start:start + micro_batch]
        total += sum(batch)
        padded += max(batch) * len(batch)
    return 0.0 if padded == 0 else 1.0 - total / padded


# ---- checks -----------------------------------------------------------------------------
@check("data.format", stage=STAGES["data"])
def data_format(ctx) -> None:
    """Every row of every file parses and has what its format needs."""
    rows, read_problems = ctx.state.rows
    fmt, train_on = ctx.recipe.data.format, ctx.recipe.data.train_on
    found: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for problem in read_problems:
        found[problem.kind].append((problem.where, problem.detail))
    for row in rows:
        for detail in row_problems(row, fmt, train_on):
            kind = "no assistant turn" if "assistant turn" in detail else "shape"
            found[kind].append((row.where, detail))
    bad = sum(len(v) for v in found.values())
    ctx.measure("rows", len(rows) + len(read_problems), "rows")
    ctx.measure("bad_rows", bad, "rows")
    if bad:
        raise Fail(f"{bad} of {len(rows) + len(read_problems)} rows are unusable for format = \"{fmt}\":\n"
                   + summarize(dict(found)))
    if not rows:
        raise Fail("the training files hold no rows")


@check("data.template", stage=STAGES["data"] + 1)
def data_template(ctx) -> None:
    """The chat template is found and renders every row; BOS once; inference prompt is a prefix."""
    recipe = ctx.recipe
    if recipe.data.format != "messages":
        raise Skip(f"format = \"{recipe.data.format}\" uses no chat template")
    try:
        encoder = ctx.state.encoder
    except ValueError as exc:
        raise Fail(str(exc)) from None
    ctx.measure("template_source", _template_source(recipe), "")
    ctx.measure("trained_span_method", encoder.method, "")
    encoded = ctx.state.encoded
    found = problems_by_kind(encoded, TEMPLATE_KINDS)
    if found:
        hints = {
            "bos_doubled": "tokenize the rendered chat with add_special_tokens=False (or drop BOS from the template)",
            "history_rewritten": "use train_on = \"last_assistant\", or split conversations into one row per assistant turn",
            "prompt_not_prefix": "the generation prompt must equal the start of the assistant turn in training renders",
        }
        advice = "; ".join(hints[k] for k in found if k in hints)
        raise Fail(f"chat template problems in {sum(len(v) for v in found.values())} place(s):\n{summarize(found)}"
                   + (f"\nFix: {advice}" if advice else ""))


def _template_source(recipe) -> str:
    if recipe.data.chat_template:
        return f"recipe override {Path(recipe.data.chat_template).name}"
    if recipe.model.path and (Path(recipe.model.path) / "chat_template.jinja").is_file():
        return "chat_template.jinja"
    return "tokenizer_config.json"


@check("data.masking", stage=STAGES["data"] + 2, requires=("data.format",))
def data_masking(ctx) -> None:
    """Labels are -100 exactly outside the trained spans; EOS trained; truncation does not eat responses."""
    state, recipe = ctx.state, ctx.recipe
    encoded = encoded_rows(ctx, "check")
    sample = [e for e in encoded if e.problems][: recipe.data.sample] or encoded[: recipe.data.sample]
    views = [token_view(state.tokenizer, e) for e in sample]  # redacted; the report draws them too
    ctx.series("examples", views)
    report = write_private(state.artifacts / "masking.html", masking_page(views, state.encoder.method))
    ctx.user_properties.append(("masking_report", str(report)))
    ctx.measure("trained_span_method", state.encoder.method, "")
    trained = sum(e.trained for e in encoded)
    total = sum(e.length for e in encoded)
    ctx.measure("trained_token_share", trained / total if total else 0.0, "share")
    partial = [e for e in encoded if any(k == "truncated_part" for k, _ in e.problems)]
    share = len(partial) / len(encoded)
    ctx.measure("truncated_response_share", share, "share")
    ctx.measure("emptied_rows", sum(1 for e in encoded if any(k == "truncated_all" for k, _ in e.problems)), "rows")
    found = problems_by_kind(encoded, MASKING_KINDS)
    limit = recipe.checks.max_truncated_share
    messages = []
    if found:
        messages.append(summarize(found))
    if share > limit:
        messages.append(f"truncation cuts the response of {len(partial)} of {len(encoded)} rows ({share:.1%} > "
                        f"max_truncated_share {limit:.1%}) [{where_list([e.row.where for e in partial])}]; "
                        f"raise [data] max_length (now {recipe.data.max_length}) or shorten those rows")
    if messages:
        bad = next((e for e in encoded if any(k in found for k, _ in e.problems)), sample[0])
        example = redact(render_example(state.tokenizer, bad))
        raise Fail("\n".join(messages) + f"\nExample {bad.row.where} (trained tokens in [[...]]):\n{example}"
                   f"\nAll shown examples: {report}")


@check("data.lengths", stage=STAGES["data"] + 3, requires=("data.format",))
def data_lengths(ctx) -> None:
    """Token length distribution, truncation rate and padding waste at the recipe's micro-batch."""
    recipe, state = ctx.recipe, ctx.state
    encoded = encoded_rows(ctx, "measure")
    full = [e.full_length for e in encoded]
    kept = [e.length for e in encoded]
    max_length = recipe.data.max_length
    ctx.measure("length_p50", percentile(full, 0.5), "tokens")
    ctx.measure("length_p95", percentile(full, 0.95), "tokens")
    ctx.measure("length_max", max(full), "tokens")
    ctx.measure("truncation_rate", sum(1 for n in full if n > max_length) / len(full), "share")
    ctx.measure("tokens_total", sum(kept), "tokens")
    mb = recipe.training.micro_batch_size
    if recipe.data.packing:
        ctx.measure("padding_waste", 0.0, "share")
    else:
        ctx.measure("padding_waste", padding_waste(kept, mb), "share")
        ctx.measure("padding_waste_grouped_by_length", padding_waste(sorted(kept), mb), "share")
    ctx.series("lengths", full)
    limit = _model_max_positions(state)
    if limit is not None:
        ctx.measure("model_max_positions", limit, "tokens")
        if max_length > limit:
            raise Fail(f"[data] max_length {max_length} exceeds the model's max_position_embeddings {limit}: "
                       f"set max_length <= {limit}")


def _model_max_positions(state):
    from ..engine.loading import model_config

    try:
        config = model_config(state.recipe)
    except Exception:  # no config reachable (offline hub model): nothing to compare
        return None
    config = config.get("text_config", config)
    return config.get("max_position_embeddings")


@check("data.packing", stage=STAGES["data"] + 4, requires=("data.masking",),
       applies=lambda r: None if r.data.packing else "the recipe does not pack ([data] packing = false)")
def data_packing(ctx) -> None:
    """A packed batch's loss equals the same examples' losses unpacked (no attention across examples)."""
    from ..engine.training import packing_mismatch

    state = ctx.state
    result = packing_mismatch(state.model, state.trainable_examples, ctx.recipe.data.max_length,
                              ctx.torch_device())
    ctx.measure("packed_examples", result.examples, "examples")
    ctx.measure("packing_max_loss_difference", result.max_difference, "nats")
    if result.examples < 2:
        raise Skip("no two trainable examples fit together in max_length; nothing to pack")
    if result.max_difference > result.tolerance:
        raise Fail(f"packed and unpacked losses differ by up to {result.max_difference:.3g} nats (tolerance "
                   f"{result.tolerance:.1g}) over {result.examples} examples: attn_implementation = "
                   f"\"{ctx.recipe.model.attn_implementation}\" lets packed examples attend across their boundaries. "
                   "Use an implementation that honours position_ids (flash_attention_2, or sdpa/eager with "
                   "transformers >= 4.53 and no attention_mask), or set packing = false")


@check("data.loader", stage=STAGES["data.loader"], requires=("data.format", "model.step_memory"))
def data_loader(ctx) -> None:
    """The data pipeline delivers tokens faster than one training step consumes them."""
    from ..engine.training import collate

    state = ctx.state
    step = state.results.get("step")
    if step is None:
        raise Skip("no training-step time measured yet (model.step_memory did not run)")
    rows, _ = state.rows
    encoder = state.encoder
    fmt, train_on = ctx.recipe.data.format, ctx.recipe.data.train_on
    sample = [r for r in rows if not row_problems(r, fmt, train_on)][:256]
    start = time.perf_counter()
    encoded = [encoder.encode(r) for r in sample]
    encode_s = time.perf_counter() - start
    tokens = sum(e.length for e in encoded)
    mb = ctx.recipe.training.micro_batch_size
    pad = state.tokenizer.pad_token_id
    start = time.perf_counter()
    for i in range(0, len(encoded), mb):
        collate(encoded[i:i + mb], pad)
    collate_s = time.perf_counter() - start
    encode_rate = tokens / encode_s if encode_s else float("inf")
    collate_rate = tokens / collate_s if collate_s else float("inf")
    ctx.measure("tokenize_tokens_per_s", encode_rate, "tokens/s")
    ctx.measure("collate_tokens_per_s", collate_rate, "tokens/s")
    ctx.measure("step_tokens_per_s", step.tokens_per_s, "tokens/s")
    if collate_rate < step.tokens_per_s:
        raise Fail(f"batching delivers {collate_rate:,.0f} tokens/s but a training step consumes "
                   f"{step.tokens_per_s:,.0f}: the accelerator waits on data; use more DataLoader workers "
                   "or pre-collated batches")
    if encode_rate < step.tokens_per_s:
        ctx.measure("advice", "pre-tokenize the dataset (datasets.map) before training: tokenizing on the fly "
                    "is slower than the step", "")
