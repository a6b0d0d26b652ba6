"""One exception hierarchy users can catch.

Two branches matter to a training run: `InfraError` (the sandbox died, a server answered 5xx,
an image is missing) is retried and never counted against the agent; `AgentError` (unknown
tool, bad arguments, a command that failed) is fed back to the agent as an observation.
"""

from __future__ import annotations

__all__ = ["AgentError", "AuthoringError", "BrowserError", "CorralError", "DatasetError",
           "DeprecatedEnv", "DuplicateRegistration", "EngineError", "EnvServerBusy",
           "EnvServerError", "EpisodeTruncated", "ImageBuildError", "ImageNotFound", "InfraError",
           "InvalidEnvId", "InvalidToolArguments", "MCPServerError", "ModelError", "NoOracle",
           "OutputTooLarge", "PageUnresponsive", "PolicyError", "RegistryError", "SandboxDied",
           "SandboxError", "SandboxUnavailable", "ToolFailed", "ToolTimeout", "UnknownBackend",
           "UnknownEnv", "UnknownTool", "VerifierError"]


class CorralError(Exception):
    """Base of every error Corral raises on purpose."""


# --- catalog / authoring --------------------------------------------------------------------
class RegistryError(CorralError):
    """Something is wrong with an environment id or its registration."""


class InvalidEnvId(RegistryError, ValueError):
    """An id does not have the form `namespace/name-vN`."""


class UnknownEnv(RegistryError, KeyError):
    """No environment is registered under an id (the message names the closest ones)."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class DeprecatedEnv(RegistryError):
    """The requested version is deprecated; the message names the replacement."""


class DuplicateRegistration(RegistryError):
    """An id is already registered with a different entry point."""


class UnknownBackend(CorralError, ValueError):
    """No sandbox backend has this name, or it cannot serve the spec (the message names the
    closest ones)."""


class AuthoringError(CorralError, TypeError):
    """An environment, tool, reward or task definition is malformed."""


class NoOracle(AuthoringError):
    """The env has no oracle (`solution`) for this task: validation cannot check that it is
    solvable and says so ("solvability unchecked (no oracle)") instead of failing it."""


class VerifierError(AuthoringError):
    """A verifier broke (no reward file, a reward that is NaN, infinite, unparsable or outside
    the env's declared range, a reward function that raised): the env's bug, reported as such
    and masked from training, never a number."""


class DatasetError(CorralError, ValueError):
    """Tasks could not be read or do not match the declared task type."""


class ModelError(CorralError, ValueError):
    """A model path does not exist or does not hold a causal LM that can be loaded."""


# --- agent-side failures: returned to the agent, never crash a run ---------------------------
class AgentError(CorralError):
    """The agent did something invalid; shown to it as an observation."""


class OutputTooLarge(AgentError, OSError):
    """A file read out of a sandbox (`read_file`, `download`, a fresh verify's outputs) is
    larger than the sandbox's `read_limit`: refused before it fills the host's memory."""


class UnknownTool(AgentError):
    """The agent called a tool that does not exist."""


class InvalidToolArguments(AgentError):
    """The agent's tool arguments failed validation."""


class ToolFailed(AgentError):
    """A tool reported an error (an MCP server's error result): shown to the agent."""


class ToolTimeout(ToolFailed):
    """A tool did not answer within its timeout (the call was abandoned)."""


# --- env outcomes: the episode cannot go on; truncated, neither retried nor an agent error ---
class EpisodeTruncated(CorralError):
    """The environment cannot go on (its page stopped responding): the episode ends as
    truncated with the rewards it can still compute, and is not retried. `reason` is a short
    tag the runner records as `truncated_by`."""

    reason = "env"


class PageUnresponsive(EpisodeTruncated):
    """A page did not answer within its timeout (its script never yields); its renderer was
    killed."""

    reason = "unresponsive"


# --- infrastructure failures: retried, never blamed on the agent -----------------------------
class InfraError(CorralError):
    """Infrastructure failed (sandbox, browser, inference server); not the agent's fault."""


class SandboxError(InfraError):
    """A sandbox could not be created, or stopped working."""


class SandboxDied(SandboxError):
    """A sandbox went away mid-episode."""


class SandboxUnavailable(SandboxError):
    """The sandbox backend (e.g. the Docker daemon) did not answer within its wait."""


class ImageNotFound(SandboxError):
    """An image is missing locally; the message names the command that builds it."""


class ImageBuildError(SandboxError):
    """Building an image failed; the message names the file and the problem."""


class BrowserError(InfraError):
    """The browser or a page crashed or could not be started."""


class PolicyError(InfraError):
    """An inference server was unreachable or answered with an error."""


class MCPServerError(InfraError):
    """An MCP server behind `cr.Tools.from_mcp` could not be started or reached, or went away
    mid-episode; the message names the command or URL and ends with the server's stderr."""


class EnvServerError(InfraError):
    """An env server (`corral serve-env`) was unreachable, died mid-episode, or refused a
    request for a reason that is not the agent's (the runner retries on another server)."""


class EnvServerBusy(EnvServerError):
    """An env server has `max_sessions` sessions open and its wait queue is full."""


class EngineError(PolicyError):
    """An inference engine (a vLLM server Corral started) could not start, died, or failed to
    load published weights; the message names the cause and the engine's log file."""
