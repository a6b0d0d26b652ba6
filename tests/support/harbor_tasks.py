"""Harbor / Terminal-Bench 2 task directories written from the public format description alone
(instruction.md, task.toml, environment/Dockerfile, solution/solve.sh, tests/test.sh)."""

from __future__ import annotations

from pathlib import Path

COUNT_TOML = """\
version = "1.0"

[metadata]
author_name = "Corral tests"
difficulty = "easy"
category = "text-processing"
tags = ["wc", "files"]

[verifier]
timeout_sec = 45.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 768
storage_mb = 2048
"""

COUNT_TEST = """\
#!/bin/bash
# Verifier: reward 1 when /app/count.txt holds the number of words in /app/data/words.txt,
# counted when the task was written (counted now, from a file the agent may have deleted, an
# empty count would match an empty answer: `delete-everything` scored 1.0)
expected=5
if [ "$(cat /app/count.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

ANSWER_TOML = """\
[metadata]
difficulty = "easy"

[verifier]
timeout_sec = 30

[environment]
docker_image = "corral/base:bookworm"
memory = "1G"
"""

ANSWER_TEST = """\
#!/bin/bash
if cmp -s /root/answer.txt /tests/expected.txt; then score=1.0; else score=0.0; fi
printf '{"reward": %s}\\n' "$score" > /logs/verifier/reward.json
"""


def write(root: Path, files: dict[str, str]) -> Path:
    """Create `files` (relative path -> text) under `root`; returns `root`."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
    return root


def count_words_task(root: Path, **overrides: str) -> Path:
    """A task with its own Dockerfile (FROM the base image, WORKDIR /app, a RUN step)."""
    files = {
        "instruction.md": "Count the words in /app/data/words.txt and write the number (digits "
                          "only) to /app/count.txt.\n",
        "task.toml": COUNT_TOML,
        "environment/Dockerfile": "FROM corral/base:bookworm\nWORKDIR /app\n"
                                  "RUN mkdir -p /app/data && \\\n"
                                  "    printf 'one two three\\nfour five\\n' \\\n"
                                  "    > /app/data/words.txt\n",
        "solution/solve.sh": "#!/bin/bash\nwc -w < /app/data/words.txt > /app/count.txt\n",
        "tests/test.sh": COUNT_TEST,
    }
    files.update(overrides)
    return write(root, files)


def answer_task(root: Path, **overrides: str) -> Path:
    """A task on a prebuilt image (`docker_image`), whose solution and tests carry data files
    next to their scripts, scored through reward.json."""
    files = {
        "instruction.md": "Write the answer to the ultimate question into /root/answer.txt.\n",
        "task.toml": ANSWER_TOML,
        "solution/solve.sh": "#!/bin/bash\ncp /solution/answer.txt /root/answer.txt\n",
        "solution/answer.txt": "42\n",
        "tests/test.sh": ANSWER_TEST,
        "tests/expected.txt": "42\n",
    }
    files.update(overrides)
    return write(root, files)


STEPS_TOML = """\
schema_version = "1.1"
multi_step_reward_strategy = "mean"

[task]
name = "corral-tests/two-steps"
description = "Write a file, then append to it."
keywords = ["files", "multi-step"]

[agent]
timeout_sec = 60.0

[environment]
docker_image = "corral/base:bookworm"
workdir = "/srv"

[environment.env]
GREETING = "hello"

[[steps]]
name = "create"
min_reward = 1.0

[steps.verifier]
timeout_sec = 20.0

[[steps]]
name = "append"
"""

# the task's shared tests/: a helper every step's test.sh sources
STEPS_LIB = """\
score() { if [ "$1" = "$2" ]; then echo 1 > /logs/verifier/reward.txt; \
else echo 0 > /logs/verifier/reward.txt; fi; }
"""


def two_step_task(root: Path, **overrides: str) -> Path:
    """A multi-step task (no top-level instruction.md): step `create` writes $GREETING to
    notes.txt in the workdir (/srv, from task.toml), step `append` adds a second line."""
    files = {
        "task.toml": STEPS_TOML,
        "tests/lib.sh": STEPS_LIB,
        "steps/create/instruction.md": "Write the value of $GREETING into notes.txt.\n",
        "steps/create/solution/solve.sh": "#!/bin/bash\necho \"$GREETING\" > notes.txt\n",
        "steps/create/tests/test.sh": "#!/bin/bash\n. /tests/lib.sh\n"
                                      "score \"$(cat /srv/notes.txt)\" hello\n",
        "steps/append/instruction.md": "Append a line 'world' to notes.txt.\n",
        "steps/append/solution/solve.sh": "#!/bin/bash\necho world >> notes.txt\n",
        "steps/append/tests/test.sh": "#!/bin/bash\n. /tests/lib.sh\n"
                                      "score \"$(tr '\\n' ' ' < /srv/notes.txt)\" 'hello world '\n",
    }
    files.update(overrides)
    return write(root, files)


COMPOSE_YAML = """\
services:
  main:
    build:
      context: ${CONTEXT_DIR}
    command: ["sh", "-c", "sleep infinity"]
    environment:
      - API_URL=http://api:8080
    depends_on:
      api:
        condition: service_healthy
  api:
    build: ./api
    environment:
      TOKEN: ${TOKEN:-blue-42}
    command: python3 /srv/api.py
    ports: ["8080:8080"]
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request as u; u.urlopen('http://localhost:8080/token')"]
      interval: 0.2s
      timeout: 2s
      retries: 50
"""

API_PY = """\
import http.server, os

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = (os.environ["TOKEN"] + "\\n").encode() if self.path == "/token" else b""
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
"""


def compose_task(root: Path, **overrides: str) -> Path:
    """A two-container task: service `api` (built from the base image) answers GET /token with
    its TOKEN; the agent's container (`main`) must write that token to /root/token.txt."""
    files = {
        "instruction.md": "Fetch $API_URL/token and write the answer to /root/token.txt.\n",
        "task.toml": '[verifier]\ntimeout_sec = 30\n[environment]\nbuild_timeout_sec = 60\n',
        "environment/Dockerfile": "FROM corral/base:bookworm\nWORKDIR /root\n",
        "environment/docker-compose.yaml": COMPOSE_YAML,
        "environment/api/Dockerfile": "FROM corral/base:bookworm\nCOPY api.py /srv/api.py\n",
        "environment/api/api.py": API_PY,
        "solution/solve.sh": "#!/bin/bash\npython3 -c \"import os, urllib.request as u; "
                             "print(u.urlopen(os.environ['API_URL'] + '/token').read().decode()"
                             ".strip())\" > /root/token.txt\n",
        "tests/test.sh": "#!/bin/bash\nif [ \"$(cat /root/token.txt 2>/dev/null)\" = blue-42 ]; "
                         "then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n",
    }
    files.update(overrides)
    return write(root, files)
