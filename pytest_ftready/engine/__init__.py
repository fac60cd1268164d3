"""The training engine: everything that builds, trains, measures, saves, resumes or generates
with the recipe's model: loading, batches, the trainable model, one measured step, the
overfit, checkpoints and the fresh-process resume, generation, packing, the sustained loop,
the measured step's memory breakdown (the levers and the forecast are ``forecast``).

Imports the recipe, the data path and the machine; never the session, the checks or
pytest. Functions take what they need (recipe, model, examples, device) as arguments and
return plain results; failures the user must fix are ``outcomes.Fail``."""
