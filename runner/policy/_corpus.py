"""A small built-in training text for the tiny tokenizer: English, shell, JSON tool calls, digits.

The tokenizer only needs merges that make common agent text a few tokens shorter than raw bytes;
every byte stays encodable through the byte-level alphabet whatever this text contains.
"""

from __future__ import annotations

_ENGLISH = """\
You are a helpful assistant. Solve the task step by step and answer briefly.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.
Please read the file, find the error and fix the permissions of the directory.
What is the answer? The answer is the sum of the two numbers. Think before you act.
Open the page, click the button and check that the result is shown on the screen.
The user asked for a list of files in the current directory and their sizes in bytes.
When the tests pass, the task is complete. If a command fails, read the error message first.
Reward is given when the output file contains the expected value and nothing else.
"""

_SHELL = """\
ls -la /tmp && cd /home/user && cat README.md | head -n 20
grep -rn "error" /var/log/app.log | wc -l
chmod 644 /etc/config.yaml; chown user:user /data; mkdir -p /srv/www/html
find . -name "*.py" -type f -exec wc -l {} +
echo "hello world" > out.txt && sort -u words.txt | uniq -c | sort -rn
python3 -c "print(sum(range(10)))"; pip install requests; git status; git diff --stat
sed -i 's/foo/bar/g' main.c && gcc -O2 -o main main.c && ./main
curl -s http://localhost:8000/health | jq .status; export PATH=/usr/local/bin:$PATH
tar -czf backup.tar.gz /srv/data && ps aux | grep nginx && kill -9 1234
"""

_TOOLS = """\
<tool_call>
{"name": "bash", "arguments": {"command": "ls -la"}}
</tool_call>
<tool_call>
{"name": "write_file", "arguments": {"path": "/tmp/answer.txt", "content": "42"}}
</tool_call>
<tool_call>
{"name": "click", "arguments": {"selector": "#submit"}}
</tool_call>
{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
"""  # noqa: E501 (a tool schema as models see it: one JSON line)


def _arithmetic() -> str:
    """Deterministic arithmetic lines so digits and operators get merged context."""
    lines = []
    for a in range(0, 100, 7):
        for b in range(3, 60, 11):
            lines.append(f"{a} + {b} = {a + b}. {a} * {b} = {a * b}. {b} - {a} = {b - a}.")
    return "\n".join(lines) + "\n"


def corpus() -> list[str]:
    """The training text, as a list of documents."""
    return [_ENGLISH, _SHELL, _TOOLS, _arithmetic()]
