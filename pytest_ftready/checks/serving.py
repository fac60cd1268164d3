"""Serving checks (issue 41): from the trained checkpoint to the model the team serves, as the
recipe's [serving] table declares it. Each is skipped, with the reason, where the recipe declares
no serving engine or another engine. The logic lives in ``pytest_ftready.serving``; these bodies
ask the run's facts and report."""

from __future__ import annotations

from ..outcomes import Fail, Skip
from .registry import STAGES, check

NO_ENGINE = "the recipe declares no serving engine ([serving] engine)"
STAGE = STAGES["lifecycle"] + 5
SAMPLED = 8  # training conversations whose inference prompts are held against the served render


def serves_with(*engines: str):
    """applies: the recipe's [serving] engine is one of ``engines``."""
    def applies(recipe):
        engine = recipe.serving.engine
        if engine == "none":
            return NO_ENGINE
        return None if engine in engines else f"[serving] engine is {engine}, not {' or '.join(engines)}"
    return applies


def _fail_all(findings: list, what: str) -> None:
    if findings:
        raise Fail(f"{what}: " + " | ".join(map(str, findings)))


@check("lifecycle.serving_template", stage=STAGE, requires=("data.masking",),
       applies=serves_with("transformers", "vllm", "llama.cpp", "ollama", "mlx"))
def serving_template(ctx) -> None:
    """The serving chat template renders each sampled training prompt to the trained token ids
    (BOS once) and closes turns with the trained stop token."""
    from ..serving import templates

    path = ctx.recipe.serving.chat_template
    if not path:
        raise Skip("no [serving] chat_template: the server uses the model's own template (the training one; "
                   "lifecycle.gguf checks a GGUF's embedded template)")
    state = ctx.state
    tok = state.tokenizer
    convs = templates.conversations(state, SAMPLED)
    if not convs:
        raise Skip("no sampled chat conversation to render (the data has no chat rows)")
    render, tokenize, describe = templates.transformers_engine(tok, path.read_text(encoding="utf-8"))
    stops = templates.stop_texts(tok, state.encoder.stop_ids)
    try:
        result = templates.compare(convs, render, tokenize, describe, tok.bos_token_id, stops,
                                   f"the serving template {path.name}")
    except Exception as exc:  # noqa: BLE001 - a template the tokenizer cannot render
        raise Fail(f"the serving template {path} does not render a training conversation: "
                   f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    ctx.measure("served_prompts", result.prompts, "prompts")
    ctx.measure("prompt_token_agreement", result.agreeing, "prompts")
    _fail_all(result.problems, "the serving template is not the trained one")


@check("lifecycle.ollama", stage=STAGE + 1, requires=("data.masking",), applies=serves_with("ollama"))
def ollama(ctx) -> None:
    """An Ollama Modelfile's TEMPLATE executed as Ollama executes it (with its SYSTEM) on each
    sampled training prompt, tokenized and held against the trained ids; PARAMETER stop against the
    trained stop token; TEMPLATE's special tokens against the training render's."""
    from ..serving import gotemplate, modelfile, templates

    path = ctx.recipe.serving.modelfile
    if not path:
        raise Skip("no [serving] modelfile: Ollama then uses the GGUF's template and stop tokens (lifecycle.gguf)")
    try:
        parsed = modelfile.parse(path)
    except (modelfile.ModelfileError, UnicodeDecodeError) as exc:
        raise Fail(str(exc)) from None
    state = ctx.state
    tok = state.tokenizer
    convs = templates.conversations(state, SAMPLED)
    if not convs:
        raise Skip("no sampled chat conversation to hold the Modelfile against")
    conv = convs[0]
    rendered = state.encoder.render([*conv.prompt, {"role": "assistant", "content": conv.answer}])
    stops = templates.stop_texts(tok, state.encoder.stop_ids)
    ctx.measure("modelfile_stops", len(parsed.stops), "stops")
    ctx.suite_property("ollama_template", "Modelfile TEMPLATE" if parsed.template is not None
                       else "the GGUF's own template (no TEMPLATE)")
    problems: list = []
    executed = False
    if parsed.template is not None:
        extras = [w for w, given in (("its SYSTEM", parsed.system), ("its MESSAGE history", parsed.messages)) if given]
        what = f"the Modelfile TEMPLATE (as Ollama executes it{' with ' + ' and '.join(extras) if extras else ''})"
        try:
            render = modelfile.ollama_engine(gotemplate.Template(parsed.template), parsed)
            tokenize, describe = templates.server_tokenizer(tok)
            result = templates.compare(convs, render, tokenize, describe, tok.bos_token_id, stops, what)
        except gotemplate.TemplateError as exc:
            problems.append(f"{path}: the TEMPLATE cannot be evaluated (lines counted within its text): {exc}; "
                            "write it with the Go template constructs Ollama's own templates use (range .Messages, "
                            "if/else, eq ...)")
        else:
            executed = True
            ctx.measure("ollama_prompts", result.prompts, "prompts")
            ctx.measure("ollama_prompt_token_agreement", result.agreeing, "prompts")
            problems += result.problems
    problems = modelfile.judge(parsed, stops, rendered, list(tok.all_special_tokens), executed) + problems
    _fail_all(problems, "the Modelfile does not serve the trained model as trained")


@check("lifecycle.vllm_adapter", stage=STAGE + 2, requires=("model.overfit",), applies=serves_with("vllm"))
def vllm_adapter(ctx) -> None:
    """The saved adapter held against vLLM's LoRA rules (rank limit, modules_to_save, embedding
    adapters, targets, architecture)."""
    import json

    from ..serving import vllm

    if ctx.recipe.adapter.method != "lora":
        raise Skip("a full fine-tune: vLLM serves the saved model itself, with no LoRA rules")
    adapter_dir = ctx.state.overfit.adapter_dir
    rules = vllm.load_rules()
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    ctx.measure("adapter_rank", config.get("r"), "rank")
    ctx.measure("vllm_max_lora_rank", ctx.recipe.serving.max_lora_rank or rules.default_rank, "rank")
    ctx.suite_property("vllm_rules", rules.origin)
    architecture = _architecture(ctx.recipe)
    _fail_all(vllm.judge_adapter(adapter_dir, rules, ctx.recipe.serving.max_lora_rank, architecture),
              f"vLLM will not serve the adapter as trained (rules: {rules.origin})")


def _architecture(recipe) -> str:
    import json

    if not recipe.model.path:
        return ""
    config = recipe.model.path / "config.json"
    try:
        return (json.loads(config.read_text()).get("architectures") or [""])[0]
    except (OSError, ValueError):
        return ""


@check("lifecycle.gguf", stage=STAGE + 3, requires=("model.overfit",), applies=serves_with("llama.cpp", "ollama"))
def gguf(ctx) -> None:
    """llama.cpp for real: the merged model converted by llama.cpp's converter, its template, stop
    tokens and greedy output held against training."""
    from ..serving import export, gguf, templates

    reason = gguf.missing()
    if reason:
        raise Skip(f"lifecycle.gguf runs llama.cpp itself and {reason}")
    converter = gguf.find_converter(ctx.recipe.serving.converter or None)
    if converter is None:
        raise Skip(gguf.GET_CONVERTER)
    state, tok = ctx.state, ctx.state.tokenizer
    work = state.scratch / "serving"
    work.mkdir(parents=True, exist_ok=True)
    ctx.suite_property("gguf_converter", gguf.converter_version(converter))
    folder = export.merged_folder(state, work / "merged")
    try:
        f16 = gguf.convert(folder, work / "model-f16.gguf", converter)
    except gguf.Refused as exc:
        raise Fail(str(exc)) from None
    ctx.measure("gguf_f16_size", f16.stat().st_size, "bytes")
    context = max(512, ctx.recipe.data.max_length + ctx.recipe.checks.max_new_tokens)
    loaded = gguf.load(f16, context=context)
    problems = []
    stop_ids = sorted(state.encoder.stop_ids)
    stops = templates.stop_texts(tok, stop_ids)
    for name, token in loaded.stop_ids().items():
        ctx.measure(f"gguf_{name}_id", token, "token")
    stopping = [i for i in stop_ids if loaded.is_eog(i)]
    ctx.measure("trained_stop_ids_stopped_on", len(stopping), "tokens")
    if not stopping:
        problems.append(f"the trained end-of-turn token(s) {' / '.join(stops)} (ids {stop_ids}) are not "
                        "end-of-generation "
                        f"tokens of the GGUF (its {loaded.stop_ids()}): llama.cpp does not stop on them and the model "
                        "runs on; set the tokenizer's eos_token (generation_config.json eos_token_id) to the "
                        "end-of-turn token before converting")
    if loaded.template is None:
        problems.append("the GGUF embeds no chat template (tokenizer.chat_template): llama.cpp and Ollama then guess "
                        "one; save the training chat template with the tokenizer before converting")
    else:
        convs = templates.conversations(state, SAMPLED)
        bos = loaded.llm.token_bos()
        result = templates.compare(convs, loaded.render, loaded.tokenize, loaded.describe, bos if bos >= 0 else None,
                                   stops, "the GGUF's chat template (as llama.cpp renders and tokenizes it)")
        ctx.measure("gguf_prompts", result.prompts, "prompts")
        ctx.measure("gguf_prompt_token_agreement", result.agreeing, "prompts")
        problems += result.problems
    run = state.overfit
    expected = list(run.greedy_ids)
    n = max(1, len(expected))
    got = loaded.greedy(run.prompt_ids, n)
    match = gguf.matching_prefix(got, expected)
    ctx.measure("greedy_tokens", len(expected), "tokens")
    ctx.measure("greedy_match_f16", match, "tokens")
    if match < len(expected):
        problems.append(f"greedy generation from the f16 GGUF differs from transformers' on the trained model at token "
                        f"{match} of {len(expected)}: llama.cpp {loaded.describe(got[match:match + 4])!r}, "
                        f"transformers {tok.decode(expected[match:match + 4])!r} (the conversion changed the model)")
    loaded.close()
    kind = ctx.recipe.serving.quantization.upper()
    if kind and kind not in ("F16", "F32", "BF16"):
        try:
            quantized = gguf.quantize(f16, work / f"model-{kind}.gguf", kind)
        except gguf.Refused as exc:
            raise Fail(str(exc)) from None
        ctx.measure("gguf_quantized_size", quantized.stat().st_size, "bytes")
        served = gguf.load(quantized, context=context)
        got_q = served.greedy(run.prompt_ids, n)
        served.close()
        ctx.measure("greedy_match_quantized", gguf.matching_prefix(got_q, expected), "tokens")
        ctx.suite_property("gguf_quantization", kind)
    _fail_all(problems, "the GGUF llama.cpp serves is not the trained model as trained")


@check("lifecycle.merged_model", stage=STAGE + 4, requires=("model.overfit",),
       applies=serves_with("transformers", "vllm", "llama.cpp", "ollama", "mlx"))
def merged_model(ctx) -> None:
    """An adapter trained on a quantized base, merged the way [serving] merge_into declares, held
    against the adapter model (the quantized base as trained + adapter): greedy output, teacher-forced
    argmax and logits, for all three ways; the remedy offered is a way measured to agree."""
    from ..serving import merge

    recipe = ctx.recipe
    if recipe.adapter.method != "lora":
        raise Skip("a full fine-tune: there is no adapter to merge (lifecycle.generate holds the saved model "
                   "against the trained one)")
    if recipe.model.quantization == "none":
        raise Skip("the base is not quantized: lifecycle.generate holds the merged model against the trained one")
    if recipe.serving.engine == "vllm" and not recipe.serving.merge_into:
        raise Skip("vLLM serves the adapter on the base, unmerged (lifecycle.vllm_adapter); set [serving] "
                   "merge_into to check a merged model served instead")
    state = ctx.state
    run, tok = state.overfit, state.tokenizer
    declared = merge.declared_way(recipe)
    ctx.suite_property("merge_into", declared)
    result = merge.measure(recipe, run.adapter_dir, run.prompt_ids, run.greedy_ids, state.encoder.stop_ids,
                           tok.pad_token_id, ctx.torch_device())
    ctx.measure("adapter_greedy_tokens", len(result.adapter_ids), "tokens")
    for way, measured in result.ways.items():
        ctx.measure(f"merged_{way}_greedy_match", measured.greedy_match, "tokens")
        ctx.measure(f"merged_{way}_argmax_agreement", measured.argmax_agreement, "share")
        ctx.measure(f"merged_{way}_max_logit_difference", measured.max_logit_difference, "")
    got = result.ways[declared]
    if got.agrees(result.adapter_ids):
        return
    at = got.greedy_match
    agreeing = [way for way in result.agreeing() if way != declared]
    remedy = ("; ".join(f"{merge.HOW[way]}: set [serving] merge_into = \"{way}\"" for way in agreeing)
              if agreeing else "none of the three merges generates what the adapter model does: serve the adapter "
              "on the quantized base unmerged")
    written = f"\"{recipe.serving.merge_into}\"" + ("" if recipe.serving.merge_into else ", read as original")
    raise Fail(f"the model merged as declared ({merge.HOW[declared]}; [serving] merge_into = {written}) is not "
               f"the trained one: at token {at} of {len(result.adapter_ids)} "
               f"it generates {tok.decode(list(got.greedy_ids[at:at + 1]))!r} where the adapter on the "
               f"{recipe.model.quantization} base generates {tok.decode(list(result.adapter_ids[at:at + 1]))!r} "
               f"(teacher-forced argmax agreement {got.argmax_agreement:.2f}, max |logit difference| "
               f"{got.max_logit_difference:.3g}): {merge.CAUSE[declared]}. Remedy: {remedy}")
