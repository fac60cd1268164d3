"""lifecycle.generate reloads the saved adapter onto a fresh load of the original base (not the
in-memory model): an adapter trained on a vocabulary resized for added tokens, or on a model of
another shape, fails there with the remedy, as peft's size mismatch would stop a team serving it.
(The passing reload is test_each_check_alone's lifecycle.generate on the tiny example.)"""

from __future__ import annotations

from pytest_ftready.engine.overfit import OverfitResult
from tests.helpers import fails

ADDED = 8  # tokens a trainer added (and resized the embeddings for)


def saved_adapter(state, tmp_path, model, prompt_ids=(0, 7), **save) -> None:
    """The overfit's result, its adapter a LoRA on q/v of ``model`` saved afresh (no training: the
    reload fails before anything is generated)."""
    from peft import LoraConfig, get_peft_model

    from pytest_ftready.engine.trainable import peft_quiet

    with peft_quiet():
        adapter = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    adapter.save_pretrained(str(tmp_path / "adapter"), **save)
    state.overfit = OverfitResult(losses=[1.0], reached=True, adapter_dir=tmp_path / "adapter",
                                  prompt_ids=list(prompt_ids), greedy_ids=[5], example_where="row 1")


def resized_base(state):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(state.recipe.model.path))
    model.resize_token_embeddings(model.get_input_embeddings().weight.shape[0] + ADDED, mean_resizing=False)
    return model


def test_an_adapter_with_resized_embeddings_fails_on_the_original_base(make_state, run_check, tmp_path):
    state = make_state()
    saved_adapter(state, tmp_path, resized_base(state), save_embedding_layers=True)
    fails(run_check, state, "lifecycle.generate", "the saved adapter does not load onto the original base",
          "its embedding rows number 1008 (adapter_model.safetensors) but the base has 1000",
          "modules_to_save", "model.resize_token_embeddings(1008) before PeftModel.from_pretrained")


def test_added_tokens_without_saved_rows_are_named(make_state, run_check, tmp_path):
    state = make_state()
    saved_adapter(state, tmp_path, resized_base(state), prompt_ids=(0, 7, 1003), save_embedding_layers=False)
    fails(run_check, state, "lifecycle.generate", "used token id(s) [1003]", "has 1000 embedding rows and the saved "
          "adapter carries none", "save_embedding_layers=True")


def test_an_adapter_of_another_base_names_the_mismatch(make_state, run_check, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    state = make_state()
    other = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         vocab_size=1000))
    saved_adapter(state, tmp_path, other)
    fails(run_check, state, "lifecycle.generate", "size mismatch for base_model.model.model.layers.0.self_attn",
          "train and serve the adapter on the same base")
