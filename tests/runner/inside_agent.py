"""A tool-calling agent with the standard library only, to run inside a sandbox (whose image
has python3 but no openai SDK, and no network to install one). It lists the models over the
unix socket CORRAL_PROXY_SOCKET, then loops over OPENAI_BASE_URL: chat with a bash tool, run
the calls here, stop when the model answers without one. First it tries each --probe URL
(the tests: none may answer) and prints what happened.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import urllib.request

BASH = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}]


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=30)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json",
                                      "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.load(reply)


def main() -> None:
    for url in sys.argv[1:]:
        try:
            urllib.request.urlopen(url, timeout=3)
            print("PROBE reached", url, flush=True)
        except OSError as exc:
            print("PROBE failed", url, type(exc).__name__, flush=True)
    base = os.environ["OPENAI_BASE_URL"]
    unix = UnixConnection(os.environ["CORRAL_PROXY_SOCKET"])
    unix.request("GET", "/" + base.split("/", 3)[3] + "/models")  # http://HOST/PATH
    print("MODELS", json.load(unix.getresponse())["data"][0]["id"], flush=True)
    messages = [{"role": "user", "content": os.environ["CORRAL_INSTRUCTION"]}]
    for _ in range(4):
        message = post(base + "/chat/completions",
                       {"model": "m", "messages": messages, "tools": BASH})["choices"][0]["message"]
        messages.append(message)
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": done.stdout + done.stderr})
    print("turns", len(messages), flush=True)


if __name__ == "__main__":
    main()
