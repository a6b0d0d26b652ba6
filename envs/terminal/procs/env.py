"""Processes and services: stop a runaway process, signal a daemon to reload, lower a process's
priority, record a PID, start an HTTP service."""

from __future__ import annotations

import random

import corral as cr

from corral.envs.terminal._family import Params, Template, TemplateFamily, family_dataset, put, word

__all__ = ["HTTP", "NICE", "PID", "PROBE", "Processes", "SIGNAL", "STOP", "TEMPLATES", "WORKER"]

# Waits on a private fifo instead of running `sleep`, so it never forks: `pgrep -x NAME` sees
# exactly one process per copy, never a short-lived child still named NAME.
WORKER = """#!/bin/bash
trap 'echo reloaded > {flag}' USR1
fifo=$(mktemp -u /run/worker.XXXXXX) && mkfifo "$fifo" && exec 9<>"$fifo" && rm -f "$fifo"
: > /run/{name}.ready.$$
while true; do read -t 0.2 -u 9; done
"""


def _daemon(name: str, flag: str = "/dev/null", copies: int = 1) -> str:
    """Bash installing /usr/local/bin/NAME (a looping script, so `comm` is NAME) and starting it
    detached; waits until every copy has its signal trap in place."""
    start = " && ".join(f"(setsid {name} >/dev/null 2>&1 < /dev/null &)" for _ in range(copies))
    return (put(f"/usr/local/bin/{name}", WORKER.format(flag=flag, name=name), "755")
            + f" && {start} && for i in $(seq 200); do [ \"$(ls /run/{name}.ready.* 2>/dev/null "
            f"| wc -l)\" -ge {copies} ] && break; sleep 0.02; done")


def _name(rng: random.Random) -> str:
    return f"{word(rng, 5)}d"


# stop ------------------------------------------------------------------------------------------
def _stop_params(rng: random.Random) -> Params:
    return {"name": _name(rng), "other": _name(rng), "copies": rng.randint(1, 3)}


STOP = Template(
    "stop-process", _stop_params,
    setup=lambda p: _daemon(p["name"], copies=p["copies"]) + " && " + _daemon(p["other"]),
    instruction=lambda p: (f"A runaway program named {p['name']} is running (maybe several "
                           f"copies). Stop every {p['name']} process; leave {p['other']} running."),
    solution=lambda p: [f"pkill -x {p['name']}; for i in $(seq 50); do pgrep -x {p['name']} "
                        ">/dev/null || break; sleep 0.05; done"],
    check=lambda p: f"! pgrep -x {p['name']} >/dev/null && pgrep -x {p['other']} >/dev/null")


# signal ----------------------------------------------------------------------------------------
def _signal_params(rng: random.Random) -> Params:
    return {"name": _name(rng), "flag": f"/run/{word(rng, 5)}.reloaded"}


SIGNAL = Template(
    "signal-reload", _signal_params,
    setup=lambda p: _daemon(p["name"], p["flag"]),
    instruction=lambda p: (f"The daemon {p['name']} reloads its configuration when it receives "
                           "SIGUSR1. Make it reload (it must keep running)."),
    solution=lambda p: [f"pkill -USR1 -x {p['name']}; for i in $(seq 50); do [ -f {p['flag']} ] "
                        "&& break; sleep 0.05; done"],
    check=lambda p: f"[ -f {p['flag']} ] && pgrep -x {p['name']} >/dev/null")


# renice ----------------------------------------------------------------------------------------
def _nice_params(rng: random.Random) -> Params:
    return {"name": _name(rng), "nice": rng.randint(5, 19)}


NICE = Template(
    "renice", _nice_params,
    setup=lambda p: _daemon(p["name"]) + f" && ps -o lstart= -p $(pgrep -xo {p['name']}) > "
    f"/run/{p['name']}.started",
    instruction=lambda p: (f"Lower the scheduling priority of the running process {p['name']} "
                           f"to a niceness of exactly {p['nice']}, without restarting it."),
    solution=lambda p: [f"renice -n {p['nice']} -p $(pgrep -x {p['name']})"],
    check=lambda p: (f"pid=$(pgrep -xo {p['name']}) && [ \"$(ps -o ni= -p $pid | tr -d ' ')\" = "
                     f"{p['nice']} ] && [ \"$(ps -o lstart= -p $pid)\" = \"$(cat /run/"
                     f"{p['name']}.started)\" ]"))


# pid file --------------------------------------------------------------------------------------
def _pid_params(rng: random.Random) -> Params:
    return {"name": _name(rng), "decoys": [_name(rng) for _ in range(2)]}


PID = Template(
    "write-pid", _pid_params,
    setup=lambda p: " && ".join(_daemon(n) for n in [*p["decoys"], p["name"]]),
    instruction=lambda p: (f"Write the process ID of the running program {p['name']} (digits "
                           "only) to /root/pid.txt."),
    solution=lambda p: [f"pgrep -x {p['name']} > /root/pid.txt"],
    check=lambda p: (f"[ -n \"$(pgrep -x {p['name']})\" ] && "
                     f"[ \"$(cat /root/pid.txt 2>/dev/null)\" = \"$(pgrep -x {p['name']})\" ]"))


# http service ----------------------------------------------------------------------------------
def _http_params(rng: random.Random) -> Params:
    return {"port": rng.randint(8000, 8999), "root": f"/srv/{word(rng, 5)}", "body": word(rng, 12)}


# -I -S: the check's interpreter runs no .pth file or sitecustomize the agent may have planted
PROBE = ("python3 -I -S -c \"import urllib.request,sys; sys.exit(urllib.request.urlopen("
         "'http://127.0.0.1:{port}/index.html', timeout=2).read().decode().strip() != '{body}')\"")

HTTP = Template(
    "start-http-service", _http_params,
    setup=lambda p: put(f"{p['root']}/index.html", p["body"] + "\n"),
    instruction=lambda p: (f"Start a web server in the background that serves the folder "
                           f"{p['root']} on 127.0.0.1 port {p['port']} (so that /index.html is "
                           "served), and leave it running."),
    solution=lambda p: [f"cd {p['root']} && (nohup python3 -m http.server {p['port']} --bind "
                        "127.0.0.1 >/dev/null 2>&1 &)",
                        f"for i in $(seq 200); do (: > /dev/tcp/127.0.0.1/{p['port']}) "
                        "2>/dev/null && break; sleep 0.05; done"],
    check=lambda p: PROBE.format(**p), live=True)

TEMPLATES = (STOP, SIGNAL, NICE, PID, HTTP)


@cr.environment(tasks=family_dataset(TEMPLATES, seed=505))
class Processes(TemplateFamily):
    """Processes and services: stop, signal, renice, find PIDs, start an HTTP service."""

    templates = TEMPLATES
