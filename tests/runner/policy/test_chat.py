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


# SmolLM2-135M-Instruct's chat template as published (tokenizer_config.json): ChatML that
# renders neither `tools` nor assistant `tool_calls`, and adds a default system prompt.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Qwen3's chat template as published (Qwen/Qwen3-8B, tokenizer_config.json): an assistant turn
# keeps its <think> block only after the last user query, and the last one gets an empty block.
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""


def _with_template(tiny_path, template: str):
    from corral.runner.policy.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_path)  # its own copy: the session's stays as it is
    tokenizer.chat_template = template
    return tokenizer


def _generate(chat: ChatTranscript, tokenizer, text: str):
    """The model "writes" `text` and its stop token; returns the parse."""
    generated = tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
    return chat.add_generation(generated, tokenizer.decode(generated, skip_special_tokens=True))


class _Counting:
    """A tokenizer that counts the chat-template renderings asked of it (else the same)."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.renders = tokenizer, 0

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self.inner.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_tools_reach_the_model_through_a_template_that_ignores_them(tiny_path) -> None:
    """SmolLM2's template drops `tools` (the model was never told it had `bash`) and fails on an
    assistant turn that is only tool calls (content None): the tools go into the system prompt
    in the Hermes format the parser reads, the calls into the turn's text."""
    from corral.runner.policy.chat import template_traits, tools_system_prompt

    tokenizer = _Counting(_with_template(tiny_path, SMOLLM2_TEMPLATE))
    assert (template_traits(tokenizer).tools, template_traits(tokenizer).tool_calls) == (False, False)
    probes = tokenizer.renders
    chat = ChatTranscript(tokenizer, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "List the files."}], tools=TOOLS)
    assert tokenizer.decode(chat.ids) == (
        "<|im_start|>system\nBe brief.\n\n" + tools_system_prompt(TOOLS) + "<|im_end|>\n"
        "<|im_start|>user\nList the files.<|im_end|>\n<|im_start|>assistant\n")
    prompt = tokenizer.decode(chat.ids)
    assert '"name": "bash"' in prompt and "<tool_call>" in prompt and "</tool_call>" in prompt
    parsed = _generate(chat, tokenizer, '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    assert parsed.tool_calls[0].arguments == {"command": "ls"} and chat.messages[-1]["content"] is None
    chat.add_messages([{"role": "tool", "content": "a.txt", "tool_call_id": parsed.tool_calls[0].id}])
    assert tokenizer.decode(chat.ids).endswith(
        '</tool_call><|im_end|>\n<|im_start|>tool\na.txt<|im_end|>\n<|im_start|>assistant\n')
    # a later prompt (SFT data, serve-policy) renders the earlier call as the text it was
    text = render(tokenizer, chat.messages, tools=TOOLS)
    assert '<|im_start|>assistant\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call><|im_end|>' in text
    # no system message of its own: the tools are one, in place of the template's default
    bare = encode_prompt(tokenizer, [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert tokenizer.decode(bare).startswith("<|im_start|>system\n# Tools\n\n") and "SmolLM" not in tokenizer.decode(bare)
    # the probe ran once for this tokenizer and template: every rendering above was a real one
    renders = tokenizer.renders
    encode_prompt(tokenizer, [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert tokenizer.renders == renders + 1 and probes == 2


def test_a_template_that_renders_tools_is_used_as_it_is(tokenizer) -> None:
    from corral.runner.policy.chat import template_traits

    assert (template_traits(tokenizer).tools, template_traits(tokenizer).tool_calls) == (True, True)
    messages = [{"role": "user", "content": "List the files."}]
    own = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert encode_prompt(tokenizer, messages, tools=TOOLS) == tokenizer.encode(own, add_special_tokens=False)


def test_qwen3_template_encodes_multi_turn_episodes_without_retokenizing(tiny_path) -> None:
    """Qwen3's template drops an assistant turn's <think> block once a new user message
    follows, and renders consecutive tool results as one user turn: the transcript keeps the
    tokens the model saw (think blocks included) and appends each new turn as the template
    renders it."""
    tokenizer = _with_template(tiny_path, QWEN3_TEMPLATE)
    chat = ChatTranscript(tokenizer, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What is 2+3?"}])
    _generate(chat, tokenizer, "<think>\nadd them\n</think>\n\n5")
    history = list(chat.ids)
    chat.add_messages([{"role": "user", "content": "And 3+4?"}])
    assert chat.ids[:len(history)] == history
    # the template itself would rewrite the first answer: history cannot come from a re-render
    assert "add them" not in render(tokenizer, chat.messages)
    _generate(chat, tokenizer, "<think>\nagain\n</think>\n\n7")
    chat.add_messages([{"role": "user", "content": "List the files."}])
    parsed = _generate(chat, tokenizer, '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    before = list(chat.ids)
    chat.add_messages([{"role": "tool", "content": "a.txt", "tool_call_id": parsed.tool_calls[0].id},
                       {"role": "tool", "content": "b.txt", "tool_call_id": parsed.tool_calls[0].id}])
    assert chat.ids[:len(before)] == before
    assert tokenizer.decode(chat.ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n5<|im_end|>\n"
        "<|im_start|>user\nAnd 3+4?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nagain\n</think>\n\n7<|im_end|>\n"
        "<|im_start|>user\nList the files.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\nb.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
