"""mini-swe-agent (PyPI `mini-swe-agent` 2.4, MIT) playing in a Corral sandbox.

    from corral.integrations.miniswe import SandboxEnvironment, run_mini_swe_agent
    run_mini_swe_agent(task=text, base_url="http://127.0.0.1:PORT/e/KEY/v1", api_key=KEY,
                       execute=run_in_sandbox)

mini-swe-agent's environments implement `execute(action, cwd, timeout) -> dict`;
`SandboxEnvironment` implements it with a function that runs a shell command in the episode's
sandbox (`AgentContext.exec` of the runner's external agents) instead of on this machine. Its
models talk to any OpenAI-compatible base URL through litellm: the agent's `LitellmModel`
(tool calling, its `bash` tool) is pointed at the given URL. Nothing of mini-swe-agent is
imported until these functions run (extra `[agents]`).
"""

from __future__ import annotations

import os
import platform
from typing import Any, Callable

__all__ = ["STEP_LIMIT", "SandboxEnvironment", "builtin_config", "preload", "run_mini_swe_agent"]

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's end-of-task marker
STEP_LIMIT = 30  # model calls, unless told

Execute = Callable[..., Any]  # (command, timeout=None, cwd=None) -> an ExecResult


def preload() -> None:
    """Import mini-swe-agent and litellm now (seconds to tens of seconds: litellm is large), so
    that an episode's deadline does not pay for it; a `CorralError` when they are missing."""
    _require()
    import litellm
    import minisweagent.agents.default  # noqa: F401
    import minisweagent.models.litellm_model  # noqa: F401

    litellm.suppress_debug_info = True  # else each failed call prints its provider list
    # litellm imports most of itself (its proxy's types) at the first completion: a mock
    # one (no request is sent) pays for that here
    litellm.completion(model="openai/corral-preload", mock_response="ok",
                       messages=[{"role": "user", "content": "preload"}])


def _require() -> None:
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # its banner goes to stdout otherwise
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")  # a local model has no price
    # litellm fetches a price list from GitHub when imported; the packaged copy is enough
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import minisweagent  # noqa: F401
    except ImportError as exc:
        from corral.errors import CorralError

        raise CorralError("the mini-swe-agent adapter needs the package: "
                          "pip install 'corral[agents]' (mini-swe-agent 2.4)") from exc


class SandboxEnvironment:
    """A mini-swe-agent environment whose commands run through `execute` (a Corral sandbox)."""

    def __init__(self, execute: Execute, *, cwd: str = "", timeout: int = 30,
                 env: dict[str, str] | None = None) -> None:
        from minisweagent.environments.local import LocalEnvironmentConfig

        self.config = LocalEnvironmentConfig(cwd=cwd, timeout=timeout, env=env or {})
        self._execute = execute

    def execute(self, action: dict[str, Any], cwd: str = "", *,
                timeout: int | None = None) -> dict[str, Any]:
        """Run `action["command"]` in the sandbox; the result as mini-swe-agent reads it
        (raises its `Submitted` when the output starts with the submit marker)."""
        from minisweagent.exceptions import Submitted

        command = action.get("command", "")
        if self.config.env:
            exports = " ".join(f"{k}={_quote(v)}" for k, v in self.config.env.items())
            command = f"export {exports}; {command}"
        try:
            result = self._execute(command, timeout=timeout or self.config.timeout,
                                   cwd=cwd or self.config.cwd or None)
        except Exception as exc:  # noqa: BLE001 - shown to the agent, as LocalEnvironment does
            return {"output": "", "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: {exc}",
                    "extra": {"exception_type": type(exc).__name__, "exception": str(exc)}}
        output = {"output": result.output, "returncode": -1 if result.timed_out
                  else result.exit_code,
                  "exception_info": "the command timed out" if result.timed_out else ""}
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """What the agent's prompt templates may name (`system`, `release`, ... and `cwd`)."""
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": self.config.model_dump(mode="json"),
                                    "environment_type": f"{__name__}.SandboxEnvironment"}}}


def _quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


def builtin_config() -> dict[str, Any]:
    """mini-swe-agent's own `mini.yaml` (its tool-calling agent): `agent`, `environment` and
    `model` sections."""
    _require()
    import yaml
    from minisweagent.config import builtin_config_dir

    return yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())


def run_mini_swe_agent(*, task: str, base_url: str, api_key: str, execute: Execute,
                       step_limit: int = STEP_LIMIT, model_name: str = "corral-policy",
                       cwd: str = "", model_kwargs: dict[str, Any] | None = None,
                       **agent_overrides: Any) -> dict[str, Any]:
    """Run mini-swe-agent's `DefaultAgent` (configured by its `mini.yaml`) on `task` with its
    model at `base_url` and its commands run by `execute`; returns its exit status,
    submission and model calls. An agent that raised (its endpoint closed at the deadline)
    returns the exception's name as its exit status."""
    _require()
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    config = builtin_config()
    templates = {k: v for k, v in config.get("model", {}).items() if k.endswith("_template")}
    model = LitellmModel(model_name=f"openai/{model_name}", cost_tracking="ignore_errors",
                         model_kwargs={"api_base": base_url, "api_key": api_key,
                                       "drop_params": True, **(model_kwargs or {})},
                         **templates)
    environment = SandboxEnvironment(execute, cwd=cwd,
                                     env=config.get("environment", {}).get("env", {}))
    agent_settings = {k: v for k, v in config["agent"].items() if k != "mode"}
    agent = DefaultAgent(model, environment, **{**agent_settings, "step_limit": step_limit,
                                                "cost_limit": 0, **agent_overrides})
    try:
        result = agent.run(task)
    except Exception as exc:  # noqa: BLE001 - it gave up: its model's endpoint closed
        return {"exit_status": type(exc).__name__, "submission": "", "error": str(exc)[:500],
                "model_calls": agent.n_calls}
    return {"exit_status": result.get("exit_status"), "submission": result.get("submission"),
            "model_calls": agent.n_calls}
