"""Incremental chat encoding and tool-call parsing of model output."""

from __future__ import annotations

from corral.runner.chat import (ChatTranscript, encode_prompt, encode_turn, generation_prompt_ids,
                                parse_assistant_message, parse_assistant_text, render,
                                turn_end_ids)
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
