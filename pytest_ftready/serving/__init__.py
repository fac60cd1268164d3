"""From the trained checkpoint to the model the team serves (issue 41): the serving engines' own
rules and code held against what training saved.

* ``templates``: the serving chat template against the training render (prompt ids, BOS, stop);
* ``modelfile``: an Ollama Modelfile parsed as Ollama reads it (FROM, TEMPLATE, SYSTEM, PARAMETER stop);
* ``vllm``: vLLM's LoRA rules (``vllm_lora.toml``, sourced; the installed vLLM's where it is) against
  the saved adapter_config.json;
* ``gguf``: llama.cpp's own converter and quantizer, and llama-cpp-python (``pip install
  pytest-ftready[llamacpp]``), run on the merged trained model.

Nothing here imports torch, llama_cpp or vllm at import time.
"""
