"""`load_policy`: the one way a command turns its model flag into a `Policy`.

`corral eval`, `profile`, `collect` and `run --agent ...` all call it (each naming its own flag
in errors). `corral train` is the exception by design: it needs the trainable model and a
weight publisher beside its rollout engine, so `corral.trainer.rollout` starts the engine from the
same model spec itself.

* a `Policy` (a started engine, any router) is used as it is;
* `http(s)://` URLs, comma-separated replicas of any OpenAI-compatible server →
  `OpenAIPolicy`, which needs a tokenizer (the served model's folder or name) to build prompts;
* a model name (`tiny`, `smollm2-135m-instruct`: `corral.runner.policy.models.model_names`),
  a local model folder, or a trainer checkpoint (its tokenizer sits beside the model; a LoRA
  run's adapter is merged onto its base) → `LocalPolicy`.
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

from corral.errors import CorralError
from corral.runner.policy.base import Policy
from corral.runner.policy.models import is_adapter_dir, is_model_name, model_names

__all__ = ["PolicySpecError", "checkpoint_parts", "load_policy", "unreachable"]


class PolicySpecError(CorralError, ValueError):
    """A model flag of the wrong form (a malformed URL, a URL without a tokenizer): the
    command line turns it into a usage error (exit 2)."""


def load_policy(model: str | Policy, *, tokenizer: str | None = None,
                device: str | None = None, flag: str = "--model",
                check_servers: bool = True) -> Policy:
    """A policy for `model` (module docstring). `flag` names the option in errors. With
    `check_servers`, a URL where nothing listens fails here, with one line, instead of as every
    episode's failure (`corral collect` passes False: it retries a server that is down and
    reports the run's infrastructure errors, docs/runner.md)."""
    if isinstance(model, Policy):
        return model
    if model.startswith(("http://", "https://")):
        from corral.runner.policy.models import load_tokenizer
        from corral.runner.policy.openai import OpenAIPolicy, replica_urls

        if not tokenizer:
            raise PolicySpecError(f"{flag} URL needs a tokenizer (--tokenizer PATH: the served "
                                  "model's directory, or 'tiny') to build prompts as token ids")
        try:  # a malformed URL failed every request, retried, and the run "succeeded"
            urls = replica_urls([u.strip() for u in model.split(",") if u.strip()])
        except ValueError as exc:
            raise PolicySpecError(f"{flag} {model}: {exc}") from None
        if not is_model_name(tokenizer) and not Path(tokenizer).exists():
            raise CorralError(f"--tokenizer {tokenizer}: no such directory (pass the served "
                              "model's directory, or 'tiny')")
        for url in urls if check_servers else ():
            problem = unreachable(url)
            if problem:
                raise CorralError(f"{flag} {url}: no server answers there ({problem})")
        try:
            loaded = load_tokenizer(tokenizer)
        except CorralError as exc:
            raise CorralError(f"--tokenizer {tokenizer}: {exc}") from None
        return OpenAIPolicy(urls, tokenizer=loaded)
    if "://" in model:  # a URL of another scheme (ftp://, ws://): the flag's value is wrong
        raise PolicySpecError(f"{flag} {model}: {model!r} is not an http:// or https:// URL "
                              "with a host")
    if not is_model_name(model) and not Path(model).exists():
        names = ", ".join(map(repr, model_names()))
        raise CorralError(f"{flag} {model!r} is neither a model name ({names}), a model "
                          "directory, nor an http:// URL")
    from corral.runner.policy.local import LocalPolicy
    from corral.runner.policy.models import load_model, load_tokenizer

    parts = None if is_model_name(model) else checkpoint_parts(Path(model))
    if parts is None:
        return LocalPolicy(model, device=device)
    # a trainer checkpoint keeps its tokenizer beside the model, not in it; a LoRA run's
    # model/ is the adapter alone, merged here onto its base
    if is_adapter_dir(parts[0]):
        lm, _ = load_model(parts[0], device=device)
    else:
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(parts[0])
        if device:
            lm.to(device)
    return LocalPolicy(lm, load_tokenizer(parts[1]), name=str(model))


def unreachable(url: str, timeout: float = 5.0) -> str | None:
    """Why nothing accepts a TCP connection at `url`'s host and port (None: something does)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=timeout).close()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def checkpoint_parts(path: Path) -> tuple[Path, Path] | None:
    """(model dir, tokenizer dir) of a trainer checkpoint (`RUN_DIR/checkpoint`) or of its
    `model/` folder (a whole model, or a LoRA run's adapter); None for an ordinary model
    directory."""
    root = path.parent if path.name == "model" else path
    held = (root / "model" / "config.json").is_file() or is_adapter_dir(root / "model")
    if held and (root / "tokenizer").is_dir():
        return root / "model", root / "tokenizer"
    return None
