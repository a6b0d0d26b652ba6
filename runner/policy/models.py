"""Models for policies and the trainer: a tiny local model builder and a checked loader.

No hub access is assumed anywhere: `build_tiny_model` makes a small Llama-style causal LM with
random weights and a byte-level BPE tokenizer trained here on a built-in text, and saves both
with `save_pretrained`; `load_model` loads any causal LM from a local directory (or `"tiny"`,
built once into the models cache, or a named pretrained model such as
`"smollm2-135m-instruct"`, converted once into it: `corral.runner.policy.pretrained`) on CUDA
in bf16 when a GPU is present, else on CPU in fp32. `resolve_model_path` is the one place a
`--model` value becomes a directory.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from corral.errors import ModelError
from corral.fileio import build_dir_once

from .pretrained import NAMED_MODELS, is_named_model, named_model_path, needs_conversion

__all__ = ["ADAPTER_CONFIG", "CHAT_TEMPLATE", "NOT_A_DEVICE", "SPECIAL_TOKENS", "TINY",
           "TOOL_TOKENS", "adapter_base", "build_tiny_model", "build_tokenizer",
           "converts_on_first_use", "default_device", "default_dtype", "device_problem",
           "is_adapter_dir", "is_model_name", "load_model", "load_tokenizer", "model_names",
           "models_cache_dir", "resolve_model_path", "stop_token_ids", "tiny_model_path"]

if TYPE_CHECKING:  # torch/transformers are the optional `train` extra: import them lazily
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

TINY = "tiny"
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]  # single tokens, but kept in decoded text

# ChatML with tools (the Hermes/Qwen convention). Every newline is an explicit Jinja literal so
# the rendering does not depend on trim_blocks/lstrip_blocks. Each message renders on its own
# (a tool result does not merge into its neighbours), which keeps incremental encoding exact.
CHAT_TEMPLATE = r"""
{%- macro render_call(call) -%}
{%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}
{{- '<tool_call>\n{"name": ' + (call.name | tojson) + ', "arguments": ' -}}
{%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endmacro -%}
{%- macro render_content(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content -%}{%- for part in content -%}{{- part.text if part.text is defined else '' -}}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set system = render_content(messages[0].content) -%}{%- set rest = messages[1:] -%}
{%- else -%}{%- set system = none -%}{%- set rest = messages -%}{%- endif -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if system -%}{{- system + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif system is not none -%}
{{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in rest -%}
{%- if message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' + render_content(message.content) -}}
{%- for call in message.tool_calls or [] -%}
{%- if not loop.first or message.content -%}{{- '\n' -}}{%- endif -%}
{{- render_call(call) -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""  # noqa: E501 (Jinja: a line break inside a tag would change the rendering)


def default_device() -> str:
    """`cuda` when a GPU is visible, else `cpu`."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


NOT_A_DEVICE = "not a torch device (cpu, cuda, cuda:N, mps, ...)"


def device_problem(device: str) -> str | None:
    """Why torch cannot place a model on `device` here (None: it can): `NOT_A_DEVICE`, or a
    CUDA device on a machine where torch sees none (or fewer)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        return NOT_A_DEVICE
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return "torch sees no CUDA GPU on this machine"
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"torch sees {torch.cuda.device_count()} CUDA GPU(s) here"
    return None


def default_dtype(device: str | None = None) -> "torch.dtype":
    """bf16 on CUDA, fp32 on CPU (CPU bf16 matmuls are slow and lose precision)."""
    import torch

    return torch.bfloat16 if str(device or default_device()).startswith("cuda") else torch.float32


def build_tokenizer(vocab: int = 1024, extra_text: Sequence[str] = ()
                    ) -> "PreTrainedTokenizerBase":
    """A byte-level BPE tokenizer trained on the built-in text (plus `extra_text` documents, e.g.
    an env's rendered tool schemas, so its prompts take fewer tokens); deterministic for given
    arguments.

    Digits are split one per token (arithmetic stays learnable); every byte is encodable.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ._corpus import corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator([*corpus(), *extra_text], trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"], padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(path: str | os.PathLike[str], *, vocab: int = 1024, hidden: int = 64,
                     layers: int = 2, heads: int = 4, seed: int = 0,
                     max_positions: int = 4096, extra_text: Sequence[str] = (),
                     tie_embeddings: bool = True) -> Path:
    """Build a randomly initialised Llama-style causal LM and its tokenizer into `path`.

    Both are written with `save_pretrained` and load back with `from_pretrained`. The same
    arguments give the same files. Generation stops at `</s>` or `<|im_end|>`. `extra_text`
    goes to the tokenizer's training text (see `build_tokenizer`). `tie_embeddings=False`
    gives the output layer its own weights (vLLM 0.32 cannot reload a tied one in place).
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if hidden % heads:
        raise ModelError(f"hidden={hidden} is not divisible by heads={heads}; pick sizes that "
                         "divide")
    out = Path(path)
    tokenizer = build_tokenizer(vocab, extra_text)
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("</s>", "<|im_end|>")]
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 4,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, tie_word_embeddings=tie_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids,
        pad_token_id=tokenizer.pad_token_id)
    cpu_rng = torch.random.get_rng_state()  # do not disturb the caller's RNG stream
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(cpu_rng)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=stop_ids,
        pad_token_id=tokenizer.pad_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log.info("built tiny model (%d params) in %s", sum(p.numel() for p in model.parameters()), out)
    return out


def models_cache_dir() -> Path:
    """Where built and converted models live: `$CORRAL_CACHE_DIR/models` (default
    `~/.cache/corral/models`)."""
    root = Path(os.environ.get("CORRAL_CACHE_DIR", Path.home() / ".cache" / "corral"))
    return root.expanduser() / "models"


def tiny_model_path(seed: int = 0) -> Path:
    """Where `load_model("tiny")` keeps its build, in `models_cache_dir()`."""
    return models_cache_dir() / f"tiny-v1-seed{seed}"


def model_names() -> list[str]:
    """The names `--model` accepts besides a directory: `tiny` and the named models."""
    return [TINY, *NAMED_MODELS]


def is_model_name(model: object) -> bool:
    """Whether `model` is one of `model_names()` (not a path)."""
    return str(model) == TINY or is_named_model(str(model))


def converts_on_first_use(model: object) -> bool:
    """Whether resolving `model` would first convert a named model (minutes: say so)."""
    return needs_conversion(str(model), models_cache_dir())


def _what_to_pass() -> str:
    return "pass a directory saved with save_pretrained, or one of " + ", ".join(
        repr(name) for name in model_names())


def resolve_model_path(model: str | os.PathLike[str]) -> Path:
    """A local model directory for `model`: `"tiny"` is built and a named model (e.g.
    `"smollm2-135m-instruct"`) converted on first use, both into `models_cache_dir()`."""
    if str(model) == TINY:
        # identical builds: concurrent processes may race, the first rename wins
        return build_dir_once(tiny_model_path(), build_tiny_model)
    if is_named_model(str(model)):
        return named_model_path(str(model), models_cache_dir())
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelError(f"model path {str(path)!r} does not exist; {_what_to_pass()}")
    if is_adapter_dir(path):
        raise ModelError(f"{str(path)!r} holds a LoRA adapter, not a whole model; load it with "
                         "load_model (merged onto its base) or pass its base model")
    if not (path / "config.json").is_file():
        raise ModelError(f"{str(path)!r} has no config.json; {_what_to_pass()} (a causal LM)")
    return path


ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path: str | os.PathLike[str]) -> bool:
    """Whether `path` holds a peft adapter (`adapter_config.json`), not a whole model."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | os.PathLike[str]) -> str:
    """The base model of the peft adapter in `path`: its `base_model_name_or_path` when that
    is a model name or an existing directory, else the `model` of the training run whose
    checkpoint holds it (`RUN_DIR/train_config.json`, the adapter being
    `RUN_DIR/checkpoint/model`); `ModelError` when neither is there."""
    folder = Path(path)
    try:
        recorded = json.loads((folder / ADAPTER_CONFIG).read_text()).get(
            "base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise ModelError(f"{str(folder / ADAPTER_CONFIG)!r} is unreadable: "
                         f"{_first_line(exc)}") from exc
    if recorded and (is_model_name(recorded) or Path(recorded).expanduser().is_dir()):
        return str(recorded)
    try:
        trained = json.loads((folder.parent.parent / "train_config.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError):
        trained = None
    if trained and (is_model_name(trained) or Path(trained).expanduser().is_dir()):
        return str(trained)
    raise ModelError(f"the LoRA adapter in {str(folder)!r} was trained on {recorded!r}, which "
                     "is not here; pass the base model's directory")


def load_tokenizer(model: str | os.PathLike[str]) -> "PreTrainedTokenizerBase":
    """The tokenizer saved with a model directory, a named model's, a tokenizer directory of
    its own (a trainer checkpoint's `tokenizer/`) or a LoRA adapter's base model's."""
    from transformers import AutoTokenizer

    given = Path(model).expanduser()
    if is_model_name(model):
        path = resolve_model_path(model)
    elif is_adapter_dir(given):
        return load_tokenizer(adapter_base(given))
    elif (given / "tokenizer_config.json").is_file():
        path = given
    else:
        path = resolve_model_path(model)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"cannot load a tokenizer from {str(path)!r}: {_first_line(exc)}") from exc


def load_model(model: str | os.PathLike[str], device: str | None = None,
               dtype: "torch.dtype | None" = None
               ) -> tuple["PreTrainedModel", "PreTrainedTokenizerBase"]:
    """Load `(model, tokenizer)` from a local directory or a model name, in eval mode. A peft
    LoRA adapter directory (a LoRA run's `checkpoint/model`) is merged onto its base model
    (`adapter_base`); the tokenizer is then the base's.

    Raises `ModelError` when the path does not exist or does not hold a causal LM.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if not is_model_name(model) and is_adapter_dir(Path(model).expanduser()):
        return _load_merged(Path(model).expanduser(), device, dtype)
    path = resolve_model_path(model)
    device = device or default_device()
    problem = device_problem(device)
    if problem:
        raise ModelError(f"device {device!r}: {problem}")
    dtype = dtype or default_dtype(device)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"{str(path)!r} has an unreadable config.json: "
                         f"{_first_line(exc)}") from exc
    try:
        lm = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype)
    except ValueError as exc:
        raise ModelError(f"{str(path)!r} holds a {config.model_type!r} model, not a causal LM; "
                         "pass a causal LM directory") from exc
    except OSError as exc:
        raise ModelError(f"cannot load weights from {str(path)!r}: {_first_line(exc)}") from exc
    lm.to(device).eval()
    return lm, load_tokenizer(path)


def _load_merged(adapter: Path, device: str | None, dtype: "torch.dtype | None"
                 ) -> tuple["PreTrainedModel", "PreTrainedTokenizerBase"]:
    """The base model with the adapter in `adapter` folded into its weights (W + scale·B·A)."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ModelError(f"{str(adapter)!r} holds a LoRA adapter; loading it needs peft: "
                         "pip install 'corral[train]'") from None
    base, tokenizer = load_model(adapter_base(adapter), device=device, dtype=dtype)
    try:
        merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelError(f"cannot apply the LoRA adapter in {str(adapter)!r} to its base: "
                         f"{_first_line(exc)}") from exc
    return merged.eval(), tokenizer


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end a generation: the tokenizer's eos plus the generation config's."""
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
