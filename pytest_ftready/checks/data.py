"""Data checks: rows, chat template, loss masking, lengths, packing, the data loader."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from ..data.encoding import CHAT_METHODS, render_example
from ..data.layouts import CHAT_LAYOUTS
from ..data.lengths import padding_waste
from ..data.digest import LISTED, sorted_sample
from ..privacy.redaction import row_values
from ..data.specials import KIND as SPECIALS
from ..data.token_view import token_view
from ..outputs.report import masking_page
from ..units import percentile
from ..outcomes import Fail, Skip
from .registry import STAGES, check

TEMPLATE_KINDS = ("render_error", "generation_prompt_ignored", "prompt_not_prefix", "history_rewritten",
                  "bos_doubled", "message_dropped", "reasoning_dropped", "tool_calls_dropped", "tools_dropped")
MASKING_KINDS = ("markers_empty", "assistant_untrained", "wrong_role_trained", "stop_untrained", "no_supervised",
                 "truncated_all", SPECIALS)
EMPTY_REASONING = "empty_reasoning_trained"  # data/verify.py: a reasoning template's empty block carrying loss
MAX_LISTED = LISTED
LENGTHS_SHOWN = 20_000  # row lengths kept for the report's histogram (evenly through them, sorted)


def where_list(places: list[str], count: int | None = None) -> str:
    """'train.jsonl:3, train.jsonl:9 and 12 more': the first places of ``count`` (default: all listed)."""
    count = len(places) if count is None else count
    shown = places[:MAX_LISTED]
    return ", ".join(shown) + (f" and {count - len(shown)} more" if count > len(shown) else "")


def summarize(found: dict) -> str:
    """kind -> Places as one paragraph per kind: count, first detail, rows."""
    parts = []
    for kind, places in found.items():
        parts.append(f"{kind} in {places.count} row(s): {places.first[0][1]} "
                     f"[{where_list([w for w, _ in places.first], places.count)}]")
    return "\n".join(parts)


def encoded_rows(ctx, purpose: str):
    """The data digest with its encoded rows (their count measured), or a failure that says why there are none."""
    digest = ctx.state.digest
    ctx.measure("rows_encoded", digest.encoded, "rows")
    if not digest.encoded:
        raise Fail(f"no well-formed row to {purpose} (see data.format)")
    return digest


def left_out(ctx, digest) -> str:
    """Rows data.format found unusable and rows the chat template failed on, which this check
    leaves out: measured (a JUnit property), and lines for the check's message ("" when none)."""
    unusable, unrendered = digest.total - digest.encoded, digest.unrendered
    if not unusable + unrendered:
        return ""
    ctx.measure("rows_left_out", unusable + unrendered, "rows")
    lines = [f"\n{unusable} of {digest.total} rows left out as unusable (see data.format)"] if unusable else []
    if unrendered:
        ctx.measure("rows_unrendered", unrendered, "rows")
        lines.append(f"\n{unrendered} of {digest.total} rows left out: the chat template fails on them (see "
                     f"data.template)")
    return "".join(lines)


def bad_rows_list(bad: list, count: int) -> str:
    """One line per unusable row listed (the first by file and line), with all its problems."""
    lines = [f"{Path(file).name}:{line}: {'; '.join(problems)}" for file, line, problems in bad[:MAX_LISTED]]
    if count > len(lines):
        lines.append(f"and {count - len(lines)} more rows")
    return "\n".join(lines)


def span_methods(digest) -> str:
    """How trained spans were found, over all rows: "generation-markers", or several joined."""
    return ", ".join(sorted(digest.methods))


# ---- checks -----------------------------------------------------------------------------
@check("data.format", stage=STAGES["data"])
def data_format(ctx) -> None:
    """Every row of every file parses and has what its layout needs; each bad row is listed once."""
    digest = ctx.state.rows
    data = ctx.recipe.data
    ctx.measure("rows", digest.total, "rows")
    ctx.measure("train_files", len(data.train), "files")  # a glob's matches, each named
    ctx.measure("train_file_names", where_list([_relative(f, ctx.recipe.folder) for f in data.train]), "")
    ctx.measure("bad_rows", digest.bad_count, "rows")
    ctx.measure("layouts", ", ".join(f"{name} {count}" for name, count in digest.layouts.most_common()), "")
    if digest.bad_count:
        raise Fail(f"{digest.bad_count} of {digest.total} rows are unusable for format = \"{data.format}\":\n"
                   + bad_rows_list(digest.bad, digest.bad_count))
    if not digest.rows:
        raise Fail("the training files hold no rows")


@check("data.template", stage=STAGES["data"] + 1)
def data_template(ctx) -> None:
    """The chat template is found and renders every conversation, every message of it; the inference
    prompt is a prefix and holds the assistant header; BOS once in every row (plain prompt/completion
    and text rows use no template: only BOS is checked)."""
    recipe = ctx.recipe
    digest = encoded_rows(ctx, "render")
    # A conversation is a row of a chat layout, whichever pipeline (built-in, a trainer's) encoded it.
    chat = bool(digest.methods & set(CHAT_METHODS)) or any(layout in CHAT_LAYOUTS for layout in ctx.state.rows.layouts)
    ctx.measure("template_source", _template_source(recipe) if chat else "none: no row is a conversation", "")
    ctx.measure("trained_span_method", span_methods(digest), "")
    skipped = left_out(ctx, digest)
    found = digest.places(TEMPLATE_KINDS)
    if found:
        hints = {
            "render_error": f"the chat template ({_template_source(recipe)}) fails on those rows: fix it, or set "
                            "[data] chat_template to one that renders them",
            "bos_doubled": "tokenize the rendered chat with add_special_tokens=False (or drop BOS from the template)",
            "generation_prompt_ignored": f"the chat template ({_template_source(recipe)}) must write the assistant "
                                         "header when add_generation_prompt is true: add its "
                                         "{% if add_generation_prompt %} branch, or set [data] chat_template to "
                                         "one that has it",
            "history_rewritten": "the template rewrites earlier assistant turns (as reasoning templates strip their "
                                 "<think> blocks): use train_on = \"last_assistant\", or split conversations into one "
                                 "row per assistant turn",
            "prompt_not_prefix": "the generation prompt must equal the start of the assistant turn in training renders",
            "message_dropped": f"the chat template ({_template_source(recipe)}) has no branch for the dropped role: "
                               "use a template that renders it ([data] chat_template = \"x.jinja\"), or fold those "
                               "messages into the user turn",
            "reasoning_dropped": "use a chat template that renders reasoning_content (a reasoning model's), or "
                                 "write the reasoning into the content the way the model's template expects",
            "tool_calls_dropped": "use a chat template that renders tool_calls ([data] chat_template = \"x.jinja\"), "
                                  "or leave tool-call rows out",
            "tools_dropped": "use a chat template that renders the tools ([data] chat_template = \"x.jinja\")",
        }
        advice = "; ".join(hints[k] for k in found if k in hints)
        raise Fail(f"chat template problems in {sum(p.count for p in found.values())} place(s):\n{summarize(found)}"
                   + (f"\nFix: {advice}" if advice else "") + skipped)


def _relative(file, folder) -> str:
    path = Path(file)
    return str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)


def _template_source(recipe) -> str:
    if recipe.data.chat_template:
        return f"recipe override {Path(recipe.data.chat_template).name}"
    if recipe.model.path and (Path(recipe.model.path) / "chat_template.jinja").is_file():
        return "chat_template.jinja"
    return "tokenizer_config.json"


@check("data.masking", stage=STAGES["data"] + 2)
def data_masking(ctx) -> None:
    """Labels are -100 exactly outside the trained spans; EOS trained; truncation does not eat responses;
    empty reasoning blocks that carry loss counted (failing with [data] train_empty_reasoning = false)."""
    state, recipe = ctx.state, ctx.recipe
    digest = encoded_rows(ctx, "check")
    sample = digest.with_problems or digest.head
    method = span_methods(digest)  # built-in encoder, TRL's SFTTrainer, or the team's pipeline
    gate = state.run.gate
    views = []
    for e in sample:  # redacted over each row's whole text; the gate learns the row's values for every output
        views.append(token_view(state.tokenizer, e, known=gate.values()))
        gate.learn(row_values(e.row.data))
    ctx.series("examples", views)
    empty, rewritten = digest.count(EMPTY_REASONING), digest.count("history_rewritten")  # the latter: data.template's
    counts = [("rows training an empty reasoning block", empty),
              ("rows whose earlier turns (their reasoning) render differently at inference", rewritten)]
    report = gate.write(state.artifacts / "masking.html", masking_page(views, method, counts))
    ctx.user_properties.append(("masking_report", str(report)))
    ctx.measure("trained_span_method", method, "")
    ctx.measure("encoded_fingerprint", f"{digest.fingerprint:016x}", "")  # changes with any token or label
    skipped = left_out(ctx, digest)
    trained, total = digest.trained_tokens, digest.total_tokens
    ctx.measure("trained_token_share", trained / total if total else 0.0, "share")
    partial = digest.count("truncated_part")
    share = partial / digest.encoded
    ctx.measure("truncated_response_share", share, "share")
    ctx.measure("emptied_rows", digest.count("truncated_all"), "rows")
    ctx.measure("empty_reasoning_rows", empty, "rows")
    ctx.measure("history_rewritten_rows", rewritten, "rows")
    found = digest.places(MASKING_KINDS)
    if empty and not recipe.data.train_empty_reasoning:
        found[EMPTY_REASONING] = digest.problems[EMPTY_REASONING]
    limit = recipe.checks.max_truncated_share
    messages = []
    if trained == 0:
        messages.append(f"{method} would train on 0 tokens of {digest.encoded} rows: the loss would look healthy "
                        "and teach nothing")
    if found:
        messages.append(summarize(found))
    if EMPTY_REASONING in found:
        messages.append("[data] train_empty_reasoning = false: leave the empty block out of the labels (in the "
                        "prompt, as LLaMA-Factory's enable_thinking: false does), give those rows their reasoning or "
                        "leave them out, or set train_empty_reasoning = true")
    if share > limit:
        places = digest.problems["truncated_part"]
        messages.append(f"truncation cuts the response of {partial} of {digest.encoded} rows ({share:.1%} > "
                        f"max_truncated_share {limit:.1%}) [{where_list([w for w, _ in places.first], partial)}]; "
                        f"raise [data] max_length (now {recipe.data.max_length}) or shorten those rows")
    if messages:
        bad = digest.first_example(found) or sample[0]
        example = render_example(state.tokenizer, bad, known=gate.values())
        raise Fail(f"labels made by {method}:\n" + "\n".join(messages)
                   + f"\nExample {bad.row.where} (trained tokens in [[...]]):\n{example}"
                   f"\nAll shown examples: {report}" + skipped)


@check("data.lengths", stage=STAGES["data"] + 3)
def data_lengths(ctx) -> None:
    """Token length distribution, truncation rate and padding waste at the recipe's micro-batch."""
    recipe, state = ctx.recipe, ctx.state
    digest = encoded_rows(ctx, "measure")
    skipped = left_out(ctx, digest)
    full, kept = digest.full_lengths, digest.lengths
    if not full:
        raise Fail("no row renders to any token: nothing to measure (see data.template)" + skipped)
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
    ctx.series("lengths", sorted_sample(full, LENGTHS_SHOWN))
    limit, unknown = _model_max_positions(state)
    if limit is None:
        raise Skip(f"[data] max_length {max_length} not compared with the model's positions: {unknown} (the lengths "
                   "are recorded)")
    ctx.measure("model_max_positions", limit, "tokens")
    if max_length > limit:
        raise Fail(f"[data] max_length {max_length} exceeds the model's max_position_embeddings {limit}: "
                   f"set max_length <= {limit}" + skipped)


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _model_max_positions(state) -> tuple[Optional[int], str]:
    """(the model's position limit, '') or (None, why it is not known)."""
    from ..engine.loading import model_config

    try:
        config = model_config(state.recipe)
    except Exception as exc:  # no config reachable (offline hub model): say so, never pass on it
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"its config could not be read ({type(exc).__name__}: {first})"
    config = config.get("text_config", config)
    found = next((config[key] for key in POSITION_KEYS if isinstance(config.get(key), int)), None)
    return found, "" if found else f"its config has none of {', '.join(POSITION_KEYS)}"


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


# A trainer config's keys for its preprocessing processes (datasets.map num_proc): TRL's, LLaMA-Factory's, Axolotl's.
PREPROCESSING_WORKERS = ("dataset_num_proc", "preprocessing_num_workers", "dataset_processes")


def preprocessing_within_timeout(ctx, encode_rate: float) -> None:
    """Rank 0 of a distributed run tokenizes the whole dataset while the other ranks wait at a
    collective: past ``ddp_timeout`` their watchdog ends the job (LLaMA-Factory #2424, #2902).
    The time is this machine's tokenize rate over every row's tokens, shared by the config's
    preprocessing workers; measured for every recipe, judged for distributed ones."""
    from ..engine.distributed import applies

    recipe, digest = ctx.recipe, ctx.state.digest
    tokens = sum(digest.full_lengths)
    said = [recipe.origin.value(k) for k in PREPROCESSING_WORKERS] if recipe.origin is not None else []
    workers = max([1, *(n for n in said if isinstance(n, int) and not isinstance(n, bool))])
    seconds = tokens / encode_rate / workers if encode_rate and encode_rate != float("inf") else 0.0
    ctx.measure("preprocessing_s", seconds, "s", estimate=True)
    if applies(recipe) is not None:
        return
    timeout = recipe.training.ddp_timeout_s
    ctx.measure("preprocessing_share_of_ddp_timeout", seconds / timeout, "share", estimate=True)
    if seconds > timeout:
        raise Fail(f"rank 0 tokenizes the {digest.encoded:,} rows ({tokens:,} tokens) in about "
                   f"{seconds:,.0f} s at this "
                   f"machine's {encode_rate:,.0f} tokens/s ({workers} worker{'s' * (workers > 1)}), past the "
                   f"{timeout:,.0f} s the other ranks wait ([training] ddp_timeout_s, the trainer's "
                   f"ddp_timeout): their "
                   "watchdog ends the job before training starts. Tokenize ahead in one process and train from the "
                   "saved dataset (datasets' save_to_disk; LLaMA-Factory's tokenized_path), run the preprocessing with "
                   "more workers, or raise ddp_timeout above the preprocessing time")


@check("data.loader", stage=STAGES["data.loader"], requires=("model.step_memory",))
def data_loader(ctx) -> None:
    """The data pipeline delivers tokens faster than one training step consumes them."""
    from ..engine.batches import collate

    state = ctx.state
    step = state.step
    if step.out_of_memory:
        raise Skip("the worst-case step runs out of memory (see model.step_memory): no step rate to compare with")
    encoder = state.encoder
    sample = state.rows.usable_rows
    start = time.perf_counter()
    encoded = [encoder.encode(r) for r in sample]
    encode_s = time.perf_counter() - start
    tokens = sum(e.length for e in encoded)
    ctx.measure("rows_timed", len(encoded), "rows")
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
    preprocessing_within_timeout(ctx, encode_rate)
    if collate_rate < step.tokens_per_s:
        raise Fail(f"batching delivers {collate_rate:,.0f} tokens/s but a training step consumes "
                   f"{step.tokens_per_s:,.0f}: the accelerator waits on data; use more DataLoader workers "
                   "or pre-collated batches")
    if encode_rate < step.tokens_per_s:
        ctx.measure("advice", "pre-tokenize the dataset (datasets.map) before training: tokenizing on the fly "
                    "is slower than the step", "")
