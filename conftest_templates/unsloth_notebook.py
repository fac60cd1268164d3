"""Your Unsloth notebook, checked: the cells of a typical Unsloth fine-tuning notebook, as one
function, hooked into pytest-ftready.

Copy this file to conftest.py beside your recipe.toml (or paste its hook into your conftest.py),
put your notebook's cells into `build_trainer` (your notebook or train.py calls it too, then
`trainer.train()`, so the checks and the real run build the same Trainer), then:

    pytest --ftready=recipe.toml

model.step_memory, model.overfit, lifecycle.resume (your Trainer's own resume_from_checkpoint,
in a fresh process that imports this file by path) and lifecycle.generate then run the Trainer
`build_trainer` returns: FastLanguageModel's loading and patches, get_peft_model's adapter,
get_chat_template's template, train_on_responses_only's masks and collator, your SFTConfig.
The step_trainer measurement names it ("conftest SFTTrainer").

Where your run is the plain notebook (these cells, your settings), a recipe with
[data] pipeline = "unsloth" and an [unsloth] table needs no conftest.py at all (docs/unsloth.md).
"""

MAX_SEQ_LENGTH = 2048  # the notebook's max_seq_length
CHAT_TEMPLATE = "chatml"  # get_chat_template's name: the one your model was trained with
INSTRUCTION_PART, RESPONSE_PART = "<|im_start|>user\n", "<|im_start|>assistant\n"
LORA = dict(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            lora_alpha=16, lora_dropout=0, bias="none", use_gradient_checkpointing="unsloth", random_state=3407)
# The notebook's SFTConfig: what the run uses where the checks set nothing (the notebooks' optim is
# "adamw_8bit" on a GPU; "adamw_torch" here so the template also runs in Unsloth's CPU mode).
SETTINGS = dict(
    dataset_text_field="text", max_length=MAX_SEQ_LENGTH, per_device_train_batch_size=2,
    gradient_accumulation_steps=4, warmup_steps=5, num_train_epochs=1, learning_rate=2e-4, logging_steps=1,
    optim="adamw_torch", weight_decay=0.01, lr_scheduler_type="linear", seed=3407, output_dir="outputs",
    report_to="none",
)


def build_trainer(model_name, dataset, **overrides):
    """The notebook's cells: load, adapter, template, formatting, trainer, masks."""
    from unsloth import FastLanguageModel  # first, as the notebook imports it (it patches transformers and TRL)
    from unsloth.chat_templates import get_chat_template, train_on_responses_only
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = FastLanguageModel.from_pretrained(model_name=model_name, max_seq_length=MAX_SEQ_LENGTH,
                                                         dtype=None, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, **LORA)
    tokenizer = get_chat_template(tokenizer, chat_template=CHAT_TEMPLATE)

    def formatting_prompts_func(examples):
        return {"text": [tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=False)
                         for convo in examples["messages"]]}

    dataset = dataset.map(formatting_prompts_func, batched=True)
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=dataset,
                         args=SFTConfig(**{**SETTINGS, **overrides}))  # the checks' bounds win over the notebook's
    return train_on_responses_only(trainer, instruction_part=INSTRUCTION_PART, response_part=RESPONSE_PART)


def pytest_ftready_trainer(recipe, rows, output_dir, arguments):
    """The Trainer the checks run: the notebook's, over the rows a check chose (a datasets.Dataset
    of your JSONL's rows), writing in output_dir, bounded by `arguments` (max_steps, save_steps,
    batch size, a constant learning rate where a check needs one: TrainingArguments keys)."""
    model = str(recipe.model.path or recipe.model.id)  # the model the recipe names (the notebook's model_name)
    return build_trainer(model, rows, **arguments)
