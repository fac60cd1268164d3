"""The memory forecast: will the recipe's training step fit, answered from the model's config
alone, before any weights are loaded.

- ``trace``: the model on the meta device, its step traced on fake tensors (``forecast``), and
  the real step's peak it is compared with (``measured_step_peak``);
- ``storage``: what cannot run on fake tensors, modelled from its documented storage and
  memory behaviour (bitsandbytes weights and optimizers, paged state, GPU loss kernels);
- ``trainers``: whose step on which device is traced (``Step``), each trainer's step keyed by
  its name (its loss, autocast and padding: TRL, Axolotl, LLaMA-Factory, the engine);
- ``levers``: the one lever model (which levers apply, each saving traced where the forecast
  runs, estimated where it cannot), and the ``Report`` against a target.

Imports the engine, the recipe and the machine; never the session, the checks, the outputs or
pytest. Its text and its command are faces of their own (``outputs.forecast_text``,
``forecast_command``)."""
