"""Incremental chat encoding and tool-call parsing of model output."""

from __future__ import annotations

from corral.runner.policy.chat import (ChatTranscript, encode_prompt, encode_turn,
                                       generation_prompt_ids, parse_assistant_message,
                                       parse_assistant_text, render, turn_end_ids)
from corral.toolcalls import ToolCallParseError

from .conftest import TOOLS


def test_transcript_matches_a_full_render(tokenizer) -> None:
    chat = ChatTranscript(tokenizer, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "List the files."}], tools=TOOLS)
    assert chat.ids == encode_prompt(tokenizer, chat.messages, tools=TOOLS)
    answer = 'Sure.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>'
    generated = tokenizer.encode(answer, add_special_tokens=False)
    parsed = chat.add_generation(generated, tokenizer.decode(generated, skip_special_tokens=True))
    assert parsed.content == "Sure." and parsed.tool_calls[0].arguments == {"command": "ls -la"}
    new = chat.add_messages([{"role": "tool", "content": "a.txt\nb.txt",
                              "tool_call_id": parsed.tool_calls[0].id}])
    assert tokenizer.decode(new) == "\n<|im_start|>tool\na.txt\nb.txt<|im_end|>\n<|im_start|>assistant\n"
    # incremental ids equal tokenizing the whole conversation at once
    full = render(tokenizer, chat.messages, tools=TOOLS, add_generation_prompt=True)
    assert chat.ids == tokenizer.encode(full, add_special_tokens=False)


def test_turn_pieces(tokenizer) -> None:
    assert tokenizer.decode(generation_prompt_ids(tokenizer)) == "<|im_start|>assistant\n"
    user = encode_turn(tokenizer, {"role": "user", "content": "hi"})
    assert tokenizer.decode(user) == "<|im_start|>user\nhi<|im_end|>\n"
    # a turn cut by max_tokens gets the whole closing; one that ended on <|im_end|> only "\n"
    cut = tokenizer.encode("abc", add_special_tokens=False)
    assert tokenizer.decode(turn_end_ids(tokenizer, cut)) == "<|im_end|>\n"
    ended = tokenizer.encode("abc<|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(turn_end_ids(tokenizer, ended)) == "\n"


def test_text_tool_calls_good_and_malformed() -> None:
    parsed = parse_assistant_text(
        'I will look. <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
        '<tool_call>{"name": "bash", "arguments": {"command": "ls",}}</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>')
    assert parsed.content == "I will look."
    assert [c.name for c in parsed.tool_calls] == ["bash"]
    assert parsed.tool_calls[0].id.startswith("call_")
    assert len(parsed.errors) == 2 and all(isinstance(e, ToolCallParseError) for e in parsed.errors)
    assert "invalid JSON" in str(parsed.errors[0]) and "name" in str(parsed.errors[1])
    message = parsed.to_message()
    assert message["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    # ids are deterministic: the same text gives the same transcript on every worker
    assert parse_assistant_text('<tool_call>{"name": "bash"}</tool_call>').tool_calls[0].id == \
        parse_assistant_text('<tool_call>{"name": "bash"}</tool_call>').tool_calls[0].id
    assert parse_assistant_text("no calls here").to_message() == {"role": "assistant",
                                                                   "content": "no calls here"}


def test_openai_tool_calls() -> None:
    parsed = parse_assistant_message({"role": "assistant", "content": None, "tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}},
        {"id": "bad", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]})
    assert parsed.tool_calls[0].id == "abc" and parsed.tool_calls[0].arguments == {"command": "pwd"}
    assert len(parsed.errors) == 1 and "arguments are not valid JSON" in str(parsed.errors[0])
    text_style = parse_assistant_message(
        {"role": "assistant", "content": '<tool_call>{"name": "x", "arguments": {}}</tool_call>'})
    assert [c.name for c in text_style.tool_calls] == ["x"]


def _long_chat(tokenizer, turns: int) -> ChatTranscript:
    chat = ChatTranscript(tokenizer, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Count the files."}], tools=TOOLS)
    for turn in range(turns):
        answer = f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "ls {turn}"}}}}\n</tool_call><|im_end|>'
        generated = tokenizer.encode(answer, add_special_tokens=False)
        parsed = chat.add_generation(generated, tokenizer.decode(generated, skip_special_tokens=True))
        chat.add_messages([{"role": "tool", "content": f"{turn} files",
                            "tool_call_id": parsed.tool_calls[0].id}])
    return chat


def test_long_transcripts_match_a_full_render_with_shortened_context(tokenizer) -> None:
    """Past the self-check (8 messages per tokenizer) new messages are rendered after the
    first and the last two messages only; the ids must not change."""
    chat = _long_chat(tokenizer, 14)
    full = render(tokenizer, chat.messages, tools=TOOLS, add_generation_prompt=True)
    assert chat.ids == tokenizer.encode(full, add_special_tokens=False)


def test_templates_that_depend_on_distant_history_are_rendered_in_full(tiny_path) -> None:
    from corral.runner.policy.models import load_tokenizer

    numbered = load_tokenizer(tiny_path)  # a template that numbers user messages by position
    numbered.chat_template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role -}}"
        "{%- if m.role == 'user' -%}{{- ' #' + loop.index|string -}}{%- endif -%}"
        "{{- '\\n' + (m.content or '') + '<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    chat = ChatTranscript(numbered, [{"role": "user", "content": "Count."}])
    for turn in range(12):
        generated = numbered.encode(f"{turn}<|im_end|>", add_special_tokens=False)
        chat.add_generation(generated, str(turn))
        chat.add_messages([{"role": "user", "content": "More."}])
    full = render(numbered, chat.messages, add_generation_prompt=True)
    assert chat.ids == numbered.encode(full, add_special_tokens=False)
    assert "user #25\n" in numbered.decode(chat.ids)
