"""A plain openai-SDK tool-calling agent, as people write them: it reads its endpoint from
OPENAI_BASE_URL / OPENAI_API_KEY and its task from CORRAL_INSTRUCTION, runs the model's bash
calls (in the episode's sandbox through CORRAL_SANDBOX_URL, or here when --local: it runs
inside the sandbox), and stops when the model answers without a call.

    python openai_agent.py [--local] [--turns N] [--probe URL]... [--uds]

--probe URL: first try to reach URL (the in-sandbox tests: it must fail) and print the result.
--uds: first list the models with a second client over the unix socket CORRAL_PROXY_SOCKET
(the SDK's own http client with a unix-socket transport) and print the first one's id.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

import openai
from openai import OpenAI

try:  # the http library this openai release is built on (openai 3.x: httpx2)
    import httpx2 as httpx
except ImportError:
    import httpx

BASH = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]


def run(command: str, local: bool) -> str:
    if local:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              timeout=30)
        return done.stdout + done.stderr
    reply = httpx.post(os.environ["CORRAL_SANDBOX_URL"] + "/exec",
                       json={"command": command, "timeout": 30},
                       headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
                       timeout=60)
    reply.raise_for_status()
    return reply.json()["output"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local", action="store_true")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--probe", action="append", default=[])
    parser.add_argument("--uds", action="store_true")
    args = parser.parse_args()
    for url in args.probe:
        try:
            httpx.get(url, timeout=3)
            print("PROBE reached", url, flush=True)
        except httpx.HTTPError as exc:
            print("PROBE failed", url, type(exc).__name__, flush=True)
    if args.uds:
        transport = httpx.HTTPTransport(uds=os.environ["CORRAL_PROXY_SOCKET"])
        unix = OpenAI(max_retries=0, http_client=openai.DefaultHttpxClient(transport=transport))
        print("MODELS", unix.models.list().data[0].id, flush=True)
    client = OpenAI(max_retries=0)
    messages = [{"role": "user", "content": os.environ["CORRAL_INSTRUCTION"]}]
    for _ in range(args.turns):
        response = client.chat.completions.create(model=os.environ.get("CORRAL_MODEL", "m"),
                                                  messages=messages, tools=BASH)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            output = run(json.loads(call.function.arguments)["command"], args.local)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    print("turns", len(messages), flush=True)


if __name__ == "__main__":
    main()
