"""llama.cpp run for real: the merged trained model converted by llama.cpp's own converter
(``convert_hf_to_gguf.py``), quantized by llama.cpp's quantizer (``llama_model_quantize`` in
llama-cpp-python's bindings), loaded by llama-cpp-python, and held against the training render and
transformers' greedy output. Needs ``pip install pytest-ftready[llamacpp]`` (llama-cpp-python,
gguf, sentencepiece) and the converter, which the llama-cpp-python wheel does not install: it is in
the package's source distribution (``vendor/llama.cpp/convert_hf_to_gguf.py``), found from
[serving] converter, $FTREADY_GGUF_CONVERTER, or an unpacked source distribution named by
$FTREADY_LLAMA_CPP_SRC. llama_cpp is imported only inside the functions."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

EXTRA = "pip install pytest-ftready[llamacpp]"
MODULES = {"llama_cpp": "llama-cpp-python", "gguf": "gguf", "sentencepiece": "sentencepiece"}
CONVERTER = "convert_hf_to_gguf.py"
IN_SDIST = Path("vendor") / "llama.cpp" / CONVERTER
GET_CONVERTER = ("llama.cpp's converter is not installed with the llama-cpp-python wheel: `pip download --no-deps "
                 "--no-binary :all: llama-cpp-python==<its version>`, unpack it, and set FTREADY_LLAMA_CPP_SRC to "
                 f"that folder (or FTREADY_GGUF_CONVERTER / [serving] converter to its {IN_SDIST})")
CONVERT_TIMEOUT_S = 1800
# what a team does when the converter refuses its model
REMEDIES = {
    "pre-tokenizer was not recognized": "llama.cpp identifies a BPE tokenizer by the hash of its output "
    "(get_vocab_base_pre in convert_hf_to_gguf.py); this tokenizer is not one it knows (custom, edited or new): train "
    "on the base model's own tokenizer files unchanged, or add the tokenizer to convert_hf_to_gguf_update.py, "
    "regenerate, and use a llama.cpp that has it",
    "not supported": "this llama.cpp does not convert the architecture: use a llama.cpp release that lists it "
    "(convert_hf_to_gguf.py's ModelBase.register), or serve with an engine that loads safetensors (vLLM, "
    "transformers)",
}


def missing() -> Optional[str]:
    """The skip reason naming the extra, or None when llama-cpp-python, gguf and sentencepiece import."""
    absent = [dist for module, dist in MODULES.items() if importlib.util.find_spec(module) is None]
    return f"needs {', '.join(absent)} ({EXTRA})" if absent else None


def find_converter(configured: Optional[Path] = None) -> Optional[Path]:
    env = os.environ
    for candidate in (configured, env.get("FTREADY_GGUF_CONVERTER"),
                      Path(env["FTREADY_LLAMA_CPP_SRC"]) / IN_SDIST if env.get("FTREADY_LLAMA_CPP_SRC") else None):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def converter_version(converter: Path) -> str:
    """gguf-py's version beside the converter (the converter itself carries none), and llama-cpp-python's."""
    from importlib.metadata import version

    project = converter.parent / "gguf-py" / "pyproject.toml"
    found = re.search(r'^version\s*=\s*"([^"]+)"', project.read_text(), re.M) if project.is_file() else None
    return f"gguf-py {found.group(1) if found else 'unknown'} (llama-cpp-python {version('llama-cpp-python')})"


class Refused(Exception):
    """The converter or the quantizer refused; str() is its message and what to do."""


def convert(model_dir: Path, out: Path, converter: Path, outtype: str = "f16") -> Path:
    """llama.cpp's own converter, in a subprocess with its gguf-py first on the path."""
    env = dict(os.environ)
    gguf_py = converter.parent / "gguf-py"
    if gguf_py.is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(gguf_py), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, str(converter), str(model_dir), "--outfile", str(out), "--outtype", outtype],
                          capture_output=True, text=True, env=env, timeout=CONVERT_TIMEOUT_S)
    if done.returncode != 0 or not out.is_file():
        raise Refused(refusal(done.stderr + done.stdout, converter))
    return out


def refusal(output: str, converter: Path) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"Error|error:|not recognized|not supported", line)]
    said = errors[-1] if errors else (lines[-1] if lines else "no output")
    remedy = next((fix for key, fix in REMEDIES.items() if key in said), "")
    return (f"llama.cpp's converter ({converter.name}) refuses the trained model: {said}"
            + (f"; {remedy}" if remedy else ""))


def quantize(f16: Path, out: Path, kind: str) -> Path:
    """llama.cpp's quantizer (llama_model_quantize) at ``kind`` (Q4_K_M, Q8_0 ...)."""
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}", None)
    if ftype is None:
        raise Refused(f"this llama-cpp-python has no quantization type {kind} (LLAMA_FTYPE_MOSTLY_{kind.upper()})")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 1
    code = llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), params)
    if code != 0 or not out.is_file():
        raise Refused(f"llama.cpp's quantizer returned {code} quantizing {f16.name} to {kind}")
    return out


@dataclass
class Loaded:
    """A GGUF loaded by llama-cpp-python, with what the serving checks read from it."""

    llm: Any  # llama_cpp.Llama
    path: Path

    @property
    def metadata(self) -> dict:
        return dict(self.llm.metadata)

    @property
    def template(self) -> Optional[str]:
        return self.metadata.get("tokenizer.chat_template")

    def close(self) -> None:
        self.llm.close()

    def is_eog(self, token: int) -> bool:
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token))

    def stop_ids(self) -> dict:
        """The GGUF's eos / eot ids (those its metadata names)."""
        meta = self.metadata
        return {name: int(meta[f"tokenizer.ggml.{name}_token_id"]) for name in ("eos", "eot", "eom")
                if f"tokenizer.ggml.{name}_token_id" in meta}

    def tokenize(self, text: str) -> list[int]:
        """As llama.cpp's server tokenizes a rendered chat prompt: special tokens parsed, the model's
        BOS added where its vocabulary says so (llama_tokenize's add_special)."""
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def describe(self, ids) -> str:
        return self.llm.detokenize(list(ids), special=True).decode("utf-8", "replace")

    def token_text(self, token: int) -> str:
        return self.describe([token])

    def render(self, messages, add_generation_prompt: bool) -> str:
        """The GGUF's embedded chat template rendered as llama-cpp-python renders it (Jinja2ChatFormatter)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llm = self.llm
        formatter = Jinja2ChatFormatter(self.template, eos_token=self.token_text(llm.token_eos()),
                                        bos_token=self.token_text(llm.token_bos()),
                                        add_generation_prompt=add_generation_prompt)
        return formatter(messages=[dict(m) for m in messages]).prompt

    def greedy(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """llama.cpp's greedy sampler (temperature 0) from ``prompt_ids``, to the first end-of-generation token."""
        out = []
        for token in self.llm.generate(list(prompt_ids), temp=0.0, top_k=1, reset=True):
            out.append(int(token))
            if self.is_eog(token) or len(out) >= max_new_tokens:
                break
        return out


def load(path: Path, context: int = 2048) -> Loaded:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=context, n_threads=max(1, min(4, os.cpu_count() or 1)), seed=0,
                verbose=False)
    return Loaded(llm, Path(path))


def matching_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
