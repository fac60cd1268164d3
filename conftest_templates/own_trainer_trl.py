"""Your own Trainer, checked: a plain TRL SFTTrainer script, hooked into pytest-ftready.

Copy this file to conftest.py beside your recipe.toml (or paste its hook into your conftest.py),
move `build_trainer` into your training script (train.py calls it too, so the checks and the
real run build the same Trainer), then:

    pytest --ftready=recipe.toml

model.step_memory, model.overfit, lifecycle.resume (your Trainer's own resume_from_checkpoint,
in a fresh process that imports this file by path) and lifecycle.generate then run the Trainer
`build_trainer` returns: its model loading, adapter, collator, optimizer and scheduler. The
step_trainer measurement names it ("conftest SFTTrainer").
"""

# The SFTConfig of train.py: what the run uses where the checks set nothing.
SETTINGS = dict(
    max_length=128, packing=False, assistant_only_loss=True,
    per_device_train_batch_size=4, gradient_accumulation_steps=2,
    learning_rate=1e-2, lr_scheduler_type="linear", num_train_epochs=3, seed=42,
    output_dir="runs/trl", save_steps=50, save_total_limit=2, logging_steps=10, report_to="none",
)
LORA = dict(r=8, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def build_trainer(model_path, train_dataset, **overrides):
    """The Trainer train.py runs: `build_trainer(MODEL, load_dataset("json", ...)["train"]).train()`."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    args = SFTConfig(**{**SETTINGS, **overrides})  # the checks' bounds win over the script's settings
    return SFTTrainer(model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer,
                      peft_config=LoraConfig(**LORA))


def pytest_ftready_trainer(recipe, rows, output_dir, arguments):
    """The Trainer the checks run: the script's, over the rows a check chose (a datasets.Dataset
    of your JSONL's rows), writing in output_dir, bounded by `arguments` (max_steps, save_steps,
    batch size, a constant learning rate where a check needs one: TrainingArguments keys)."""
    model = str(recipe.model.path or recipe.model.id)  # the model the recipe names (your MODEL)
    return build_trainer(model, rows, **arguments)
