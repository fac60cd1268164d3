"""Data checks: rows, chat template, loss masking, lengths, packing, the data loader."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable

from ..data.encoding import CHAT_METHODS, render_example
from ..data.lengths import padding_waste
from ..data.layouts import read_sample, row_problems
from ..data.redaction import row_values
from ..data.token_view import token_view
from ..outputs.report import masking_page
from ..units import percentile
from ..outcomes import Fail, Skip
from .registry import STAGES, check

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
    encoded = ctx.state.encoded
    if not encoded:
        raise Fail(f"no well-formed row to {purpose} (see data.format)")
    return encoded


def left_out(ctx, encoded: list) -> str:
    """Rows data.format found unusable, which this check leaves out: measured (a JUnit
    property), and a line for the check's message ("" when none)."""
    rows, read_problems = ctx.state.rows
    total = len(rows) + len(read_problems)
    count = total - len(encoded)
    if not count:
        return ""
    ctx.measure("rows_left_out", count, "rows")
    return f"\n{count} of {total} rows left out as unusable (see data.format)"


def bad_rows_list(bad: list[tuple[str, int, list[str]]]) -> str:
    """One line per unusable row, sorted by file and line, with all its problems."""
    bad = sorted(bad, key=lambda b: (b[0], b[1]))
    lines = [f"{Path(file).name}:{line}: {'; '.join(problems)}" for file, line, problems in bad[:MAX_LISTED]]
    if len(bad) > MAX_LISTED:
        lines.append(f"and {len(bad) - MAX_LISTED} more rows")
    return "\n".join(lines)


def span_methods(encoded: list) -> str:
    """How trained spans were found, over all rows: "generation-markers", or several joined."""
    return ", ".join(sorted({e.method for e in encoded}))


# ---- checks -----------------------------------------------------------------------------
@check("data.format", stage=STAGES["data"])
def data_format(ctx) -> None:
    """Every row of every file parses and has what its layout needs; each bad row is listed once."""
    rows, read_problems = ctx.state.rows
    data = ctx.recipe.data
    bad = [(p.file, p.line, [p.detail]) for p in read_problems]
    layouts: Counter = Counter()
    for row in rows:
        sample, problems = read_sample(row, data.format, data.train_on, data.roles)
        if problems:
            bad.append((row.file, row.line, problems))
        else:
            layouts[sample.layout] += 1
    total = len(rows) + len(read_problems)
    ctx.measure("rows", total, "rows")
    ctx.measure("bad_rows", len(bad), "rows")
    ctx.measure("layouts", ", ".join(f"{name} {count}" for name, count in layouts.most_common()), "")
    if bad:
        raise Fail(f"{len(bad)} of {total} rows are unusable for format = \"{data.format}\":\n" + bad_rows_list(bad))
    if not rows:
        raise Fail("the training files hold no rows")


@check("data.template", stage=STAGES["data"] + 1)
def data_template(ctx) -> None:
    """The chat template is found and renders every conversation; inference prompt is a prefix; BOS once
    in every row (plain prompt/completion and text rows use no template: only BOS is checked)."""
    recipe = ctx.recipe
    encoded = encoded_rows(ctx, "render")
    chat = any(e.method in CHAT_METHODS for e in encoded)
    ctx.measure("template_source", _template_source(recipe) if chat else "none: no row is a conversation", "")
    ctx.measure("trained_span_method", span_methods(encoded), "")
    skipped = left_out(ctx, encoded)
    found = problems_by_kind(encoded, TEMPLATE_KINDS)
    if found:
        hints = {
            "bos_doubled": "tokenize the rendered chat with add_special_tokens=False (or drop BOS from the template)",
            "history_rewritten": "use train_on = \"last_assistant\", or split conversations into one row per assistant turn",
            "prompt_not_prefix": "the generation prompt must equal the start of the assistant turn in training renders",
        }
        advice = "; ".join(hints[k] for k in found if k in hints)
        raise Fail(f"chat template problems in {sum(len(v) for v in found.values())} place(s):\n{summarize(found)}"
                   + (f"\nFix: {advice}" if advice else "") + skipped)


def _template_source(recipe) -> str:
    if recipe.data.chat_template:
        return f"recipe override {Path(recipe.data.chat_template).name}"
    if recipe.model.path and (Path(recipe.model.path) / "chat_template.jinja").is_file():
        return "chat_template.jinja"
    return "tokenizer_config.json"


@check("data.masking", stage=STAGES["data"] + 2)
def data_masking(ctx) -> None:
    """Labels are -100 exactly outside the trained spans; EOS trained; truncation does not eat responses."""
    state, recipe = ctx.state, ctx.recipe
    encoded = encoded_rows(ctx, "check")
    sample = [e for e in encoded if e.problems][: recipe.data.sample] or encoded[: recipe.data.sample]
    method = span_methods(encoded)  # built-in encoder, TRL's SFTTrainer, or the team's pipeline
    gate = state.run.gate
    views = []
    for e in sample:  # redacted over each row's whole text; the gate learns the row's values for every output
        views.append(token_view(state.tokenizer, e, known=gate.values()))
        gate.learn(row_values(e.row.data))
    ctx.series("examples", views)
    report = gate.write(state.artifacts / "masking.html", masking_page(views, method))
    ctx.user_properties.append(("masking_report", str(report)))
    ctx.measure("pipeline", state.pipeline.name, "")
    ctx.measure("trained_span_method", method, "")
    skipped = left_out(ctx, encoded)
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
    if trained == 0:
        messages.append(f"{method} would train on 0 tokens of {len(encoded)} rows: the loss would look healthy "
                        "and teach nothing")
    if found:
        messages.append(summarize(found))
    if share > limit:
        messages.append(f"truncation cuts the response of {len(partial)} of {len(encoded)} rows ({share:.1%} > "
                        f"max_truncated_share {limit:.1%}) [{where_list([e.row.where for e in partial])}]; "
                        f"raise [data] max_length (now {recipe.data.max_length}) or shorten those rows")
    if messages:
        bad = next((e for e in encoded if any(k in found for k, _ in e.problems)), sample[0])
        example = render_example(state.tokenizer, bad, known=gate.values())
        raise Fail("\n".join(messages) + f"\nExample {bad.row.where} (trained tokens in [[...]]):\n{example}"
                   f"\nAll shown examples: {report}" + skipped)


@check("data.lengths", stage=STAGES["data"] + 3)
def data_lengths(ctx) -> None:
    """Token length distribution, truncation rate and padding waste at the recipe's micro-batch."""
    recipe, state = ctx.recipe, ctx.state
    encoded = encoded_rows(ctx, "measure")
    skipped = left_out(ctx, encoded)
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
                       f"set max_length <= {limit}" + skipped)


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
    from ..engine.packing import packing_mismatch

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


@check("data.loader", stage=STAGES["data.loader"], requires=("model.step_memory",))
def data_loader(ctx) -> None:
    """The data pipeline delivers tokens faster than one training step consumes them."""
    from ..engine.batches import collate

    state = ctx.state
    step = state.step
    if step.out_of_memory:
        raise Skip("the worst-case step runs out of memory (see model.step_memory): no step rate to compare with")
    rows, _ = state.rows
    encoder = state.encoder
    data = ctx.recipe.data
    sample = [r for r in rows if not row_problems(r, data.format, data.train_on, data.roles)][:256]
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
