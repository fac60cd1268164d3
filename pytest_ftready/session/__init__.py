"""The session: one ``RunState`` per pytest run (the machine, probed once; the recipes;
every measurement) and one ``RecipeState`` per recipe whose facts (tokenizer, rows,
encoded data, model, the measured step, the overfit, the saved checkpoint, the scan, the
sustained run) are computed on demand, once, with failures remembered; and the
``CheckContext`` a check body receives.

Imports the recipe, data path, privacy, engine, machine and outputs; never a check module or
pytest."""
