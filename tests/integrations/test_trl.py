"""`corral.integrations.trl` under a real TRL `GRPOTrainer` on the tiny model, on CPU.

Single-turn: the env's verifier is the reward function; every score TRL trained on is
checked against the env scoring the same completion. Multi-turn: a terminal env in a real
bubblewrap sandbox is TRL's tool environment; the tiny model is first taught the task's tool
call, so the rollouts run it in the sandbox and the env's verifier scores them 1.0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import corral as cr
from corral.errors import AgentError, UnknownEnv
from corral.integrations import trl as ctrl
from corral.runner.policy import build_tiny_model, load_model, load_tokenizer
from finetune import teach_continuation

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny steps, shared cores
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is experimental

TEXT = "corral/arithmetic-v0"
TERM = "corral/term-files-v0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("trl-model") / "tiny")


def _config(out: Path, **extra: Any) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(out), max_steps=2, per_device_train_batch_size=4,
                      num_generations=4, learning_rate=1e-3, logging_steps=1,
                      save_strategy="no", report_to="none", use_cpu=True, seed=0,
                      dataloader_num_workers=0, **extra)


def test_single_turn_rewards_are_the_env_verifier(tiny: Path, tmp_path: Path) -> None:
    from trl import GRPOTrainer

    dataset = ctrl.env_dataset([TEXT], size=8)
    assert dataset.column_names == ["prompt", "environment", "task_index"]
    (reward,) = ctrl.reward_funcs([TEXT])
    seen: list[tuple[int, Any, float | None]] = []

    def corral_reward(prompts: list[Any], completions: list[Any], **kw: Any) -> Any:
        scores = reward(prompts, completions, **kw)  # what TRL handed the env, and its score
        seen.extend(zip(kw["task_index"], completions, scores))
        return scores

    trainer = GRPOTrainer(model=str(tiny), reward_funcs=[corral_reward],
                          train_dataset=dataset,
                          processing_class=load_tokenizer(tiny),
                          args=_config(tmp_path, max_completion_length=8))
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 8
    logged = [h["rewards/corral_reward/mean"] for h in trainer.state.log_history
              if "rewards/corral_reward/mean" in h]
    assert len(logged) == 2
    env = cr.make(TEXT)
    for index, completion, score in seen:  # each score is what the env says of the completion
        env.reset(options={"task_index": index})
        _, expected, done, *_ = env.step(completion[-1]["content"])
        assert done and score == expected
    for step in range(2):
        scores = [s for _, _, s in seen[step * 4:(step + 1) * 4]]
        assert logged[step] == pytest.approx(sum(scores) / 4)
    # and a right answer is worth 1, through the same function
    answer = [[{"role": "assistant", "content": str(env.tasks[seen[0][0]].answer)}]]
    assert reward([[]], answer, environment=[TEXT], task_index=[seen[0][0]]) == [1.0]
    assert reward([[]], answer, environment=["other/env-v0"], task_index=[0]) == [None]
    with pytest.raises(UnknownEnv, match="Did you mean"):
        ctrl.EnvReward("corral/arithmetc-v0")


def _teach_tool_call(tiny: Path, out: Path, prompt: list[dict[str, str]], tools: list[Any],
                     call: dict[str, Any]) -> Path:
    """A tiny model fine-tuned until greedy decoding of `prompt` (rendered as TRL renders it,
    with `tools`) is `call` as a Hermes tool call. Its tokenizer learnt the rendered prompt
    (`extra_text`): half the tokens, a fifth of the fine-tune time."""
    kwargs: dict[str, Any] = {"conversation": [prompt], "tools": tools,
                              "add_generation_prompt": True}
    (text,) = load_tokenizer(tiny).apply_chat_template(**kwargs, tokenize=False)
    model, tok = load_model(build_tiny_model(out / "base", extra_text=[text] * 20))
    ids = tok.apply_chat_template(**kwargs, tokenize=True, return_dict=True)["input_ids"][0]
    target = tok.encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>",
                        add_special_tokens=False)
    # p > 0.6 per token: the argmax, which T=0.05 samples
    teach_continuation(model, list(ids), target, min_logp=-0.5).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.bwrap
def test_multi_turn_tool_environment_runs_in_a_sandbox(tiny: Path, tmp_path: Path,
                                                       base_image: str) -> None:
    from datasets import concatenate_datasets
    from trl import GRPOTrainer

    Env = ctrl.environment_factory(TERM, backend="bwrap")
    assert issubclass(Env, ctrl.CorralEnvironment) and Env.env_id == TERM
    from transformers.utils import get_json_schema

    probe = Env()
    schemas = [get_json_schema(getattr(probe, n)) for n in ("bash", "write_file")]
    local = {s["function"]["name"]: s["function"] for s in cr.make(TERM).tool_schemas()}
    for schema in schemas:  # what the model is shown is the env's own tool schema
        fn = schema["function"]
        assert fn["description"] == local[fn["name"]]["description"]
        assert fn["parameters"]["required"] == local[fn["name"]]["parameters"]["required"]
        assert set(fn["parameters"]["properties"]) == set(local[fn["name"]]["parameters"][
            "properties"])

    one = ctrl.env_dataset([TERM], size=1, seed=1)
    (index,) = one["task_index"]
    (call,) = cr.make(TERM).solution(cr.make(TERM).tasks[index])
    model = _teach_tool_call(tiny, tmp_path / "taught", one[0]["prompt"],
                             [probe.bash, probe.write_file],
                             {"name": call.name, "arguments": call.arguments})
    instances: list[ctrl.CorralEnvironment] = []

    def factory() -> ctrl.CorralEnvironment:
        instances.append(Env())
        return instances[-1]

    trainer = GRPOTrainer(
        model=str(model), environment_factory=factory,
        train_dataset=concatenate_datasets([one, one]),
        processing_class=ctrl.hermes_tool_parsing(load_tokenizer(model)),
        args=_config(tmp_path / "out", max_completion_length=96, temperature=0.05,
                     max_tool_calling_iterations=2))
    trainer.train()
    assert trainer.state.global_step == 2
    logged = [h for h in trainer.state.log_history if f"rewards/{Env.__name__}/mean" in h]
    assert logged and all(h[f"rewards/{Env.__name__}/mean"] == 1.0 for h in logged), logged
    used = [i for i in instances if i._env.episode is not None]
    assert len(used) == 4  # one per rollout of a step, reset (not remade) for the next step
    for inst in used:  # the tool ran in the sandbox and the env's verifier said so
        episode = inst._env.episode
        assert episode.task.id == cr.make(TERM).tasks[index].id
        assert episode.done and episode.reward == 1.0 and episode.verify_span is not None
        assert [m for m in episode.messages if m["role"] == "tool"]
        assert episode.sandbox is None  # released when scored, not at the next reset


@pytest.mark.bwrap
def test_tool_environment_without_trl(base_image: str) -> None:
    """The class TRL drives, driven by hand: tools are turns, the reward is the verifier's."""
    Env = ctrl.environment_factory([TERM, "corral/guess-number-v0"], backend="bwrap")[TERM]
    env = Env()
    assert env.reset(prompt=[{"role": "user", "content": ""}]) == env._env.episode.messages[
        -1]["content"]  # TRL's data-free rows get the instruction from reset
    task = env._env.episode.task
    for call in env._env.solution(task):
        assert isinstance(getattr(env, call.name)(**call.arguments), str)
    assert env.get_reward() == 1.0 and env._env.episode.sandbox is None
    with pytest.raises(AgentError, match="episode is over"):
        env.bash(command="ls")
    env.reset(prompt=[{"role": "user", "content": "x"}], task_index=3)
    assert env.bash(command="echo hi-$((6*7))").startswith("hi-42")
    assert env.get_reward() == 0.0  # nothing solved

    Game = ctrl.environment_factory(["corral/guess-number-v0"])["corral/guess-number-v0"]
    game = Game()
    assert game.reset(prompt=[{"role": "user", "content": "guess"}], task_index=0) is None
    secret = game._env.episode.task.secret
    assert game.reply(message=str(secret)) == "" and game.get_reward() > 1.0
