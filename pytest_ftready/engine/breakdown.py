"""Where the memory of a training step goes, and what each lever the recipe allows would
save. Savings are estimates from the measured breakdown, labelled as such."""

from __future__ import annotations

from dataclasses import dataclass

from ..units import human_bytes


@dataclass(frozen=True)
class Breakdown:
    weights_bytes: int  # every parameter (frozen and trainable)
    frozen_numel: int
    trainable_bytes: int
    gradient_bytes: int  # one gradient per trainable parameter
    optimizer_state_bytes: int
    peak_bytes: int  # the measured peak of the step

    @property
    def activation_bytes(self) -> int:
        """What the peak holds besides weights, gradients and optimizer state."""
        return max(0, self.peak_bytes - self.weights_bytes - self.gradient_bytes - self.optimizer_state_bytes)


@dataclass(frozen=True)
class Lever:
    name: str
    change: str  # what to write in the recipe
    saves_bytes: int
    cost: str


def breakdown(model, optimizer, peak_bytes: int) -> Breakdown:
    import torch

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    frozen_numel = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    state = 0
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor):
                state += value.numel() * value.element_size()
    return Breakdown(weights, frozen_numel, trainable_bytes, trainable_bytes, state, peak_bytes)


def levers_for(recipe, b: Breakdown, num_layers: int, p95_length: float | None = None) -> list[Lever]:
    """The levers this recipe can still pull, largest estimated saving first."""
    t, m, a = recipe.training, recipe.model, recipe.adapter
    act = b.activation_bytes
    out = []
    if not t.gradient_checkpointing and act:
        out.append(Lever("activation checkpointing", "[training] gradient_checkpointing = true",
                         int(act * (1 - 1 / max(1, num_layers))), "~20-30% slower steps (recomputed forward)"))
    if t.micro_batch_size > 1 and act:
        half = t.micro_batch_size // 2
        out.append(Lever("smaller micro-batch, more accumulation",
                         f"[training] micro_batch_size = {half}, gradient_accumulation_steps = "
                         f"{t.gradient_accumulation_steps * t.micro_batch_size // half}",
                         int(act * (1 - half / t.micro_batch_size)), "same effective batch; lower utilization"))
    if p95_length and p95_length < recipe.data.max_length and act:
        target = max(16, int(2 ** (int(p95_length - 1).bit_length())))
        if target < recipe.data.max_length:
            out.append(Lever("shorter max_length", f"[data] max_length = {target} (p95 of lengths is {p95_length:.0f})",
                             int(act * (1 - target / recipe.data.max_length)), "rows above it are truncated"))
    if a.method == "none":
        out.append(Lever("LoRA instead of full fine-tuning", "[adapter] method = \"lora\"",
                         int((b.gradient_bytes + b.optimizer_state_bytes) * 0.98), "fewer trainable parameters"))
    if a.method == "lora" and m.quantization == "none" and b.weights_bytes:
        frozen_bytes = b.weights_bytes - b.trainable_bytes
        out.append(Lever("4-bit base (QLoRA)", "[model] quantization = \"4bit\"",
                         max(0, int(frozen_bytes - b.frozen_numel * 0.5)),
                         "needs bitsandbytes; slower matmuls, small quality cost"))
    if t.optimizer == "adamw" and b.optimizer_state_bytes:
        out.append(Lever("8-bit optimizer", "[training] optimizer = \"adamw_8bit\"",
                         int(b.optimizer_state_bytes * 0.75), "needs bitsandbytes"))
    if b.optimizer_state_bytes:
        out.append(Lever("optimizer state offload to the host", "DeepSpeed ZeRO-Offload / FSDP CPU offload",
                         b.optimizer_state_bytes, "slower steps: measure it (levers.sweep)"))
    return sorted(out, key=lambda lever: lever.saves_bytes, reverse=True)


def advice_text(levers: list[Lever]) -> str:
    if not levers:
        return "no lever left in this recipe: a smaller model or a larger device"
    return "\n".join(f"  - {lv.name}: {lv.change}; saves ~{human_bytes(lv.saves_bytes)} (estimate); cost: {lv.cost}"
                     for lv in levers)
