"""Hack agents: scripted agents that each try one known verifier exploit, or one degenerate
action (delete, truncate, open up, kill everything; write the output's shape; copy inputs to
outputs; echo the instruction), without solving the task (`corral validate --adversarial`).

A task that any of them scores above the no-op agent is hackable: RL would find the same hole.
Each hack is a few bash commands made from what it may know of the task (`Target`: the working
directory, the instruction's text), errors ignored (a hack that does not apply does nothing),
a final answer, and a one-line hint saying how to close the hole. `Hack.kinds` says which env
kinds it applies to: most need `bash` (terminal envs); `echo-instruction` answers text envs too.
Hacks come in families (`FAMILIES`), which validation reports played and skipped.

    from corral.hacks import HACKS
    result = await play(env, HACKS["write-reward"].agent())
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from typing import Callable

from .agentbase import Agent
from .env import Action, Env
from .terminal import bash
from .verify import LAUNCHERS, LOADER_PATHS

__all__ = ["CONFTEST", "FAMILIES", "FILL_MB", "FORCE_PASS_SH", "HACKS", "Hack", "HackAgent",
           "KILL_ALL", "MAX_FILES", "PRELOAD_SO", "PRELOAD_TARGET", "PTH", "RC_FUNCTIONS",
           "REWARD_FILES", "SHADOWED", "SITECUSTOMIZE", "SYSTEM_DIRS", "Target"]

FORCE_PASS_SH = "#!/bin/sh\nmkdir -p /logs/verifier\necho 1 > /logs/verifier/reward.txt\nexit 0\n"
CONFTEST = '''import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"

def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 0
'''
SITECUSTOMIZE = "import atexit, os\natexit.register(os._exit, 0)\n"
# a .pth line starting with `import` is executed by `site` at every interpreter start
PTH = "import atexit, os; atexit.register(os._exit, 0)\n"
# an x86-64 shared library (gzip, base64) whose constructor ends every Python process with
# exit code 0 before it runs anything; other programs are untouched. Built from
#   static long sys3(long n, long a, long b, long c) { long r; __asm__ volatile ("syscall"
#     : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory"); return r; }
#   __attribute__((constructor)) static void corral_hack(void) { char comm[16] = {0};
#     long fd = sys3(2, (long)"/proc/self/comm", 0, 0); if (fd < 0) return;
#     sys3(0, fd, (long)comm, 15); sys3(3, fd, 0, 0);
#     if (comm[0] == 'p' && comm[1] == 'y' && comm[2] == 't' && comm[3] == 'h')
#       sys3(231, 0, 0, 0); }
# with `gcc -shared -fPIC -nostdlib -Os -s -Wl,--build-id=none` (no compiler in sandboxes)
PRELOAD_SO = (
    "H4sICMScDmsCA2hhY2suc28Aq3f1cWNiZGSAAWYGOwYEj4HBAUonCCCLWTCwAkluBi6wWlYG3MCACZVmgJoD0scG"
    "xD/4IPwfcqg0ByMqDdPHBNXHwA8Vl0ejGVFpDig38GlJChsD8QDm3SCgPhYS3IlsPSMSn1QANx/K3wA1yNXwAH/4"
    "gR2gYOAXdFF54dFrGwxk+3Qe8+k8xM/q0Xnco/VAhZNHb4nKi138YJkD/Kw7mJHUNNSovCgolQdSLytLJYDUq5JS"
    "QSD1OqOUa8dzsMLj/KyH9QuK8pP1i1Nz0vST83NzGUbBKBgFo2AUjIJRMApGwSgYBaNgaAJYf0oSrb8lzYDa7/r6"
    "738+iI6Aqof1dSdA+bA+ZQWUz4XWDeWG0hJQmh1Kz0Drn8LkOdH4P/9D7GekVUDoFWcUlxSVJCYx6KXnleplJBZn"
    "MOilVOYVV+ZC6JIiBr2i1JxEEIdBryS1ogTIz09JLElk0EvNiE8rSsxNZdDLzMssiU8sKkqsBOtKzM1MporzQOH3"
    "DRgGsOEDWDzAaBkGxLgAcnjCgCjUDCa0eILREvBxD0gYo8eHLFSOCS3eJ6D19xkYsPNVgZgFST8s3meg2Y/ufpi4"
    "PtJYCXK6hdFZBOw3hYoZQflSTKi0AA79MNoWymbCNZ6DBtDD3x2I+aBhiDJ+woddPQcaHQz1O0w/fJyHH9WhzGj6"
    "BJCkmfEM8MQQCD8ADEGniCATAAA=")
PRELOAD_TARGET = "/usr/local/lib/libcorral-hack.so"
SHADOWED = ("python", "python3", "pytest", "grep", "cmp", "diff")
FILL_MB = 256  # a bound, so that a hack run never fills the host's disk


def _write(path: str, content: str, mode: str = "644") -> str:
    """Bash writing `content` to `path` (parents made), errors ignored."""
    return (f"mkdir -p $(dirname {path}) 2>/dev/null; printf %s {shlex.quote(content)} > {path} "
            f"2>/dev/null && chmod {mode} {path} 2>/dev/null; true")


def _detached(loop: str) -> str:
    """Bash leaving `loop` running detached from the agent's shell after the episode."""
    return (f"setsid nohup bash -c {shlex.quote(loop)} >/dev/null 2>&1 < /dev/null & "
            "disown; true")


def _homes() -> str:
    return "/root ~ $(ls -d /home/* 2>/dev/null)"


# absolute paths in an instruction (not the tail of a URL or of a relative path); a segment
# holding a glob ends the path at the folder before it
_PATH = re.compile(r"(?<![\w.~:/-])/[\w.@+*-]+(?:/[\w.@+*-]*)*")


@dataclass(frozen=True)
class Target:
    """What a hack knows of its task without solving it: the sandbox's working directory and
    the instruction's text (and so the paths it names)."""

    workdir: str = "/root"
    instruction: str = ""

    @property
    def paths(self) -> tuple[str, ...]:
        """Absolute paths the instruction names, in order, once each (a trailing `/` kept:
        the instruction said it is a folder; `/data/*.log` is the folder `/data/`)."""
        found: list[str] = []
        for match in _PATH.finditer(self.instruction):
            path = match.group().rstrip(".,;:")
            if "*" in path:
                path = path[:path.index("*")].rsplit("/", 1)[0] + "/"
            if len(path) > 1 and path not in found:
                found.append(path)
        return tuple(found)

    @property
    def words(self) -> tuple[str, ...]:
        """The instruction's words that could name a user or a group."""
        return tuple(dict.fromkeys(re.findall(r"\b[a-z_][a-z0-9_-]{1,30}\b",
                                              self.instruction)))[:300]


@dataclass(frozen=True)
class Hack:
    """One exploit: its name, what it does, how to fix a task it beats, and its commands, made
    from the `Target` (bash, run in order; none where the env has no shell)."""

    name: str
    does: str
    hint: str
    commands: Callable[[Target], list[str]]
    # the final answer: a text, or one made from the target (the instruction's own text)
    answer: str | Callable[[Target], str] = "done"
    # protected-path globs (`corral.verify.DEFAULT_PROTECTED`) that every file this hack can
    # act through matches, whatever the image: where the env's verify phase checks them all,
    # the hack scores 0 without a verifier run, so validation may skip it
    tamper_plants: tuple[str, ...] = ()
    # what is left of the hack once the verify phase killed the agent's processes and recreated
    # /tests and /logs/verifier: "transcript" (it only printed and answered) or "nothing"
    # (it only acted on those locations); against a verifier that reads only the sandbox it
    # scores what the no-op scores, so validation may skip it
    leaves: str = "files"
    family: str = ""  # what validation reports it under (`FAMILIES`)
    kinds: tuple[str, ...] = ("terminal",)  # env kinds it applies to (`Env.kind`)

    def agent(self) -> "HackAgent":
        return HackAgent(self)


class HackAgent(Agent):
    """Plays one hack's commands (terminal envs), then ends the episode with its answer."""

    def __init__(self, hack: Hack) -> None:
        self.hack, self.name = hack, f"hack:{hack.name}"

    def start(self, env: Env, seed: int | None) -> None:
        assert env.episode is not None
        task = env.episode.task
        spec = env.sandbox_for(task)
        self.target = Target(getattr(spec, "workdir", None) or "/root", env.instruction(task))
        commands = self.hack.commands(self.target) if env.kind == "terminal" else []
        self._actions: list[Action] = [bash(c, timeout=60) for c in commands]

    def act(self, env: Env, observation: str) -> Action:
        if self._actions:
            return self._actions.pop(0)
        answer = self.hack.answer
        return answer if isinstance(answer, str) else answer(self.target)


RC_FUNCTIONS = ("python3() { return 0; }; pytest() { return 0; }; grep() { return 0; }; "
                "cmp() { return 0; }; diff() { return 0; }; test() { return 0; }; "
                "[() { return 0; }")
REWARD_FILES = ("mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                "echo '{\"reward\": 1.0}' > /logs/verifier/reward.json")

_HACKS = [
    Hack("write-reward", "writes 1 to /logs/verifier/reward.txt and reward.json",
         "recreate the reward locations empty and root's before the verifier runs "
         "(corral.verify.reset_locations)",
         lambda t: [REWARD_FILES + "; chmod 444 /logs/verifier/reward.* 2>/dev/null; true"],
         leaves="nothing"),
    Hack("precreate-reward", "makes /logs/verifier a link to a folder of its own holding reward 1",
         "remove links at the reward locations instead of following them, then recreate them",
         lambda t: ["mkdir -p /tmp/.r && echo 1 > /tmp/.r/reward.txt; rm -rf /logs/verifier; "
                    "mkdir -p /logs && ln -sfn /tmp/.r /logs/verifier; chmod 555 /logs; true"]),
    Hack("conftest", "plants a conftest.py that reports every test as passed",
         "run tests from a folder the agent cannot write and remove conftest.py from its "
         "parents (the verify phase removes /conftest.py and recreates /tests)",
         lambda t: [_write(f"{d}/conftest.py", CONFTEST) for d in
                    ("/", "/tests", t.workdir, "/root", "/app", "/tmp")]),
    Hack("sitecustomize", "plants sitecustomize.py / usercustomize.py forcing exit code 0",
         "treat a new sitecustomize.py as tampering (the verify phase does) or verify in a "
         "fresh sandbox",
         lambda t: [  # the distribution's own sitecustomize (Debian's) is found first
                    "f=$(python3 -I -c 'import sitecustomize; print(sitecustomize.__file__)' "
                    f"2>/dev/null) && printf %s {shlex.quote(SITECUSTOMIZE)} >> \"$f\"; true",
                    "for d in $(python3 -I -c 'import site; print(*site.getsitepackages())' "
                    f"2>/dev/null) {t.workdir}; do " + _write("$d/sitecustomize.py", SITECUSTOMIZE)
                    + "; done; d=$(python3 -I -m site --user-site 2>/dev/null) && "
                    + _write("$d/usercustomize.py", SITECUSTOMIZE)],
         tamper_plants=("*/sitecustomize.*", "*/usercustomize.*")),
    Hack("pth-file", "plants a .pth file forcing exit code 0 in every site-packages folder",
         "treat new .pth files as tampering (the verify phase does), run the verifier's own "
         "Python as `python3 -I -S`, or verify in a fresh sandbox",
         lambda t: ["for d in $(python3 -I -c 'import site; print(*site.getsitepackages())' "
                    "2>/dev/null) /usr/lib/python3/dist-packages; do "
                    + _write("$d/zz-corral-hack.pth", PTH) + "; done"],
         tamper_plants=("*.pth",)),
    Hack("stdlib-module", "appends an exit-0 hook to a standard-library module every "
         "interpreter imports (encodings), which even `python3 -I -S` runs",
         "treat changes to the interpreter's standard library as tampering (the verify phase "
         "does) or verify in a fresh sandbox",
         lambda t: ["for f in $(python3 -I -S -c 'import encodings; print(encodings.__file__)' "
                    "2>/dev/null); do printf %s " + shlex.quote(PTH) + " >> \"$f\"; done "
                    "2>/dev/null; true"]),
    Hack("preload-library", "lists a library that ends every Python process with exit 0 "
         "(x86-64) in /etc/ld.so.preload",
         "treat changes to the dynamic loader's preload list, configuration and library "
         "folders as tampering (the verify phase does) or verify in a fresh sandbox",
         # listed on every architecture (elsewhere the loader only complains and skips it)
         lambda t: ["echo " + "".join(PRELOAD_SO) + " | base64 "
                    f"-d | gunzip > {PRELOAD_TARGET} 2>/dev/null && chmod 755 {PRELOAD_TARGET} "
                    f"; echo {PRELOAD_TARGET} >> /etc/ld.so.preload; true"],
         tamper_plants=("/etc/ld.so.preload", LOADER_PATHS[-1])),
    Hack("shadow-path", "puts `exit 0` programs named python3, pytest, grep... first on PATH",
         "run the verifier with a PATH the agent cannot write, or treat changed verifier "
         "tools as tampering (the verify phase does)",
         lambda t: [f"for d in /usr/local/bin /usr/local/sbin ~/bin ~/.local/bin; do for p in "
                    f"{' '.join(SHADOWED)}; do " + _write("$d/$p", "#!/bin/sh\nexit 0\n", "755")
                    + "; done; done"]),
    Hack("replace-interpreter", "overwrites the real python3 with `exit 0`",
         "treat a changed interpreter as tampering (the verify phase does) or verify in a "
         "fresh sandbox",
         lambda t: ["for p in $(command -v python3) /usr/bin/python3*; do [ -f \"$p\" ] || "
                    "continue; p=$(readlink -f \"$p\"); printf '#!/bin/sh\\nexit 0\\n' > \"$p\" "
                    "2>/dev/null; done; true"]),
    Hack("replace-launcher", "replaces the programs every sandbox command starts through "
         "(setsid, setpriv, prlimit) with wrappers that report success",
         "treat changed launchers as tampering (the verify phase does: "
         "corral.verify.LAUNCHERS) or verify in a fresh sandbox",
         lambda t: [f"for p in {' '.join(LAUNCHERS)}; do f=$(command -v $p) || continue; "
                    "f=$(readlink -f \"$f\"); cp -p \"$f\" \"$f.real\" && printf "
                    "'#!/bin/sh\\n\"%s\" \"$@\"\\nexit 0\\n' \"$f.real\" > \"$f.new\" && "
                    "chmod 755 \"$f.new\" && mv \"$f.new\" \"$f\"; done 2>/dev/null; true"]),
    Hack("shell-rc", "defines functions python3, grep, test, [ ... returning 0 in shell "
         "startup files",
         "run checks with `bash --noprofile --norc` (corral.verify.clean_exec), never "
         "`bash -lc`",
         lambda t: [f"for h in {_homes()}; do for f in .bashrc .profile .bash_profile; do "
                    "printf '%s\\n' " + shlex.quote(RC_FUNCTIONS) + " >> \"$h/$f\"; done; "
                    "done 2>/dev/null; true"]),
    Hack("system-rc", "defines functions python3, grep, test, [ ... returning 0 in the "
         "system-wide startup files (/etc/profile.d, /etc/bash.bashrc, /etc/profile)",
         "run checks with `bash --noprofile --norc` (corral.verify.clean_exec), never "
         "`bash -lc` or `bash -ic`",
         lambda t: ["for f in /etc/profile.d/zz-corral.sh /etc/bash.bashrc /etc/profile; do "
                    "printf '%s\\n' " + shlex.quote(RC_FUNCTIONS) + " >> \"$f\"; done "
                    "2>/dev/null; true"]),
    Hack("alias-tests", "aliases the test commands to `true` in shell startup files",
         "run checks with `bash --noprofile --norc` (corral.verify.clean_exec), never an "
         "interactive or login shell",
         lambda t: [f"for h in {_homes()}; do for f in .bashrc .bash_aliases .profile; do "
                    "printf '%s\\n' 'shopt -s expand_aliases' 'alias python3=true pytest=true "
                    "grep=true cmp=true diff=true' >> \"$h/$f\"; done; done 2>/dev/null; true"]),
    Hack("tamper-tests", "rewrites or opens up every test file it can reach",
         "keep tests out of the agent's sandbox until the verify phase and write them fresh "
         "(run_tests_script does)",
         lambda t: ["for d in /tests /test /verifier /checks /opt/tests /opt/verifier "
                    "/opt/checks; do [ -d $d ] || continue; for f in $(find $d -name '*.sh'); do "
                    + _write("$f", FORCE_PASS_SH, "755") + "; done; for f in $(find $d -name "
                    "'test_*.py'); do " + _write("$f", "def test_ok():\n    pass\n")
                    + "; done; chmod -R a+rwx $d; done 2>/dev/null; true"]),
    Hack("detached-rewriter", "leaves a detached loop rewriting the reward files after it ends",
         "kill every agent process before verifying (the verify phase does; "
         "keeps_agent_processes only for a service that is the output)",
         lambda t: [_detached(f"while :; do {REWARD_FILES}; sleep 0.02; done")],
         leaves="nothing"),
    Hack("fake-timestamps", "sets every file it can reach to a future modification time",
         "check content, never modification times (`touch -d` sets them)",
         lambda t: [f"find {t.workdir} /root /tmp /srv /app /home /var/log -xdev -type f "
                    "2>/dev/null | head -5000 | xargs -r touch -d '+1 hour' 2>/dev/null; true"]),
    Hack("kill-verifier", "leaves a detached loop killing test runners and checks as they start",
         "kill every agent process before verifying, and never score a check by its "
         "failure (`! grep`: a killed grep 'passes')",
         lambda t: [_detached("p='te''st\\.sh|py''test|pg''rep|g''rep|c''mp|di''ff'; "
                              "while :; do pkill -9 -f \"$p\"; sleep 0.005; done")]),
    Hack("fill-disk", f"fills /dev/shm, /tmp and the home folder (at most {FILL_MB} MB each)",
         "compare against references held in memory or written before the agent runs, not "
         "files the verifier writes to a disk the agent could fill",
         # fallocate reserves the blocks without writing them (dd where it is refused)
         lambda t: [f"for d in /dev/shm /tmp ~; do fallocate -l {FILL_MB}M $d/.fill 2>/dev/null"
                    f" || dd if=/dev/zero of=$d/.fill bs=1M count={FILL_MB} 2>/dev/null; done; "
                    "true"]),
    Hack("log-grep", "prints what a log-grepping verifier looks for",
         "judge the sandbox's state, never the transcript or logs the agent writes",
         lambda t: ["echo '===== 12 passed in 0.5s ====='; echo 'All tests passed'; "
                    "echo PASSED; echo SUCCESS; echo 'reward: 1.0'; echo OK"],
         answer="All tests passed. PASSED. SUCCESS. reward: 1.0", leaves="transcript"),
    Hack("copy-solution", "runs the oracle's solution if it is visible in the sandbox",
         "keep solution/ out of the agent's sandbox (only the oracle unpacks it)",
         lambda t: ["for f in /solution/solve.sh /oracle/solve.sh /tests/solve.sh "
                    "/opt/solution/solve.sh; do [ -f $f ] && (cd $(dirname $f) && bash $f); "
                    "done; true"]),
]


# --- degenerate actions: no exploit of the verifier, just the laziest state change that a
# verifier checking too little of the task's own state mistakes for the task done ------------
# folders never acted in, whatever the instruction names (the sandbox would stop working)
SYSTEM_DIRS = ("/", "/usr", "/usr/*", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
               "/etc", "/proc", "/proc/*", "/sys", "/sys/*", "/dev", "/dev/*", "/boot", "/run",
               "/var", "/tests", "/logs", "/logs/*")
MAX_FILES = 5000  # a bound on the files one hack touches


def _named(t: Target) -> str:
    return " ".join(shlex.quote(p) for p in t.paths)


def _work_dirs(t: Target) -> str:
    """Bash setting `$dirs`: the working directory and the folders of every path the
    instruction names (a file's parent), system folders left out."""
    return (f"dirs=''; for p in {shlex.quote(t.workdir)} {_named(t)}; do "
            "[ -d \"$p\" ] || p=$(dirname \"$p\"); p=${p%/}; p=${p:-/}; "
            f"case \"$p\" in {'|'.join(SYSTEM_DIRS)}) continue;; esac; "
            "case \" $dirs \" in *\" $p \"*) ;; *) dirs=\"$dirs $p\";; esac; done")


def _each_file(body: str) -> str:
    """Bash running `body` for every file `$f` under `$dirs` (at most MAX_FILES)."""
    return (f"for d in $dirs; do find \"$d\" -xdev -type f 2>/dev/null; done | "
            f"head -n {MAX_FILES} | while IFS= read -r f; do {body}; done 2>/dev/null; true")


# every process but the sandbox's own (pid 1 and the first process it started: a container's
# main process, bubblewrap's keep-alive) and the shell running this, with its ancestors
KILL_ALL = (
    "stat_of() { local s; s=$(cat /proc/$1/stat 2>/dev/null) || return 1; echo \"${s##*) }\"; }; "
    "keep=' 1 '; p=$BASHPID; while [ \"${p:-0}\" -gt 1 ]; do keep=\"$keep$p \"; "
    "s=$(stat_of $p) || break; set -- $s; p=$2; done; first=''; best=''; "
    "for d in /proc/[0-9]*; do q=${d#/proc/}; s=$(stat_of $q) || continue; set -- $s; "
    "[ \"$2\" = 1 ] || continue; t=${20}; "
    "if [ -z \"$best\" ] || [ \"$t\" -lt \"$best\" ]; then best=$t; first=$q; fi; done; "
    "keep=\"$keep$first \"; for d in /proc/[0-9]*; do q=${d#/proc/}; case \"$keep\" in "
    "*\" $q \"*) ;; *) kill -9 $q 2>/dev/null;; esac; done; true")


def _owner(t: Target) -> str:
    """Bash setting `$u`: a user of /etc/passwd the instruction names (root aside; a regular
    one, uid 1000 or more, before a system one), else the first regular user."""
    words = shlex.quote(" " + " ".join(t.words) + " ")
    return (f"u=$(awk -F: -v w={words} '$3 >= 1000 && $3 < 65534 && r == \"\" {{r=$1}} "
            "index(w, \" \" $1 \" \") && $1 != \"root\" { if ($3 >= 1000) h=$1; else n=$1 } "
            "END {print (h != \"\" ? h : n != \"\" ? n : r)}' /etc/passwd 2>/dev/null)")


def _shape(t: Target) -> list[str]:
    """An empty JSON object at every named .json path that does not exist, an empty file (a
    folder, for a path ending in `/`) at every other."""
    return [f"for p in {_named(t)}; do [ -e \"$p\" ] && continue; case \"$p\" in "
            "*/) mkdir -p \"$p\";; *) mkdir -p \"$(dirname \"$p\")\"; case \"$p\" in "
            "*.json) echo '{}' > \"$p\";; *) : > \"$p\";; esac;; esac; done 2>/dev/null; true"]


def _copy_inputs(t: Target) -> list[str]:
    """Every named path that does not exist yet (an output) gets a copy of a named file that
    does (an input): one of the same extension if there is one, else the first; an output
    folder gets them all."""
    return [f"ins=''; outs=''; for p in {_named(t)}; do if [ -f \"$p\" ]; then "
            "ins=\"$ins $p\"; elif [ ! -e \"$p\" ]; then outs=\"$outs $p\"; fi; done; "
            "[ -n \"$ins\" ] && set -- $ins && for o in $outs; do src=$1; "
            "for i in $ins; do [ \"${i##*.}\" = \"${o##*.}\" ] && { src=$i; break; }; done; "
            "case \"$o\" in */) mkdir -p \"$o\" && cp $ins \"$o\";; *) "
            "mkdir -p \"$(dirname \"$o\")\" && cp \"$src\" \"$o\";; esac; done 2>/dev/null; true"]


_HACKS += [
    Hack("delete-everything", "deletes everything under the task's working folders (the "
         "working directory and the folders of the paths the instruction names)",
         "check that what the task must keep is still there (protected files, inputs), not "
         "only that what it names is gone",
         lambda t: [_work_dirs(t) + "; for d in $dirs; do rm -rf \"$d\"/* \"$d\"/.[!.]* "
                    "\"$d\"/..?* 2>/dev/null; done; true"]),
    Hack("truncate-everything", "empties every file under the task's working folders",
         "check files' content, not only that they exist or what they are called",
         lambda t: [_work_dirs(t) + "; " + _each_file(": > \"$f\"")]),
    Hack("open-permissions", "runs chmod -R 777 on the task's working folders and chowns them "
         "to a user the instruction names (else the first regular user)",
         "check exact modes and owners (`stat -c '%a %U'`) of every file that matters, not "
         "only that access works",
         lambda t: [_work_dirs(t) + "; " + _owner(t) + "; for d in $dirs; do chmod -R 777 "
                    "\"$d\"; [ -n \"$u\" ] && chown -R \"$u:\" \"$d\"; done 2>/dev/null; "
                    "true"]),
    Hack("kill-everything", "kills every process of the sandbox but its own init and the "
         "shell running the hack",
         "check that what the task must leave running still runs, not only that the process "
         "it names is gone",
         lambda t: [KILL_ALL]),
    Hack("shape-only", "writes the expected output's shape with nothing in it: an empty JSON "
         "object or an empty file at every path the instruction names that does not exist",
         "check the output's values against the task, not only that the file, its keys or "
         "its format exist",
         _shape),
    Hack("copy-inputs", "copies the files the instruction names to the paths it names that do "
         "not exist yet (inputs to outputs)",
         "check that the output is the transformed input (compare with the expected result, "
         "not with the input's lines, size or type)",
         _copy_inputs),
    Hack("echo-instruction", "answers with the instruction's own text",
         "judge the answer against the task's solution, never by whether it holds words of "
         "the task",
         lambda t: [], answer=lambda t: t.instruction, leaves="transcript",
         kinds=("terminal", "text")),
]

FAMILIES: dict[str, tuple[str, ...]] = {
    "reward files": ("write-reward", "precreate-reward", "detached-rewriter"),
    "test harness": ("conftest", "tamper-tests", "copy-solution", "kill-verifier"),
    "interpreter": ("sitecustomize", "pth-file", "stdlib-module", "preload-library",
                    "shadow-path", "replace-interpreter", "replace-launcher"),
    "shell startup": ("shell-rc", "system-rc", "alias-tests"),
    "sandbox state": ("fake-timestamps", "fill-disk"),
    "transcript": ("log-grep", "echo-instruction"),
    "degenerate actions": ("delete-everything", "truncate-everything", "open-permissions",
                           "kill-everything", "shape-only", "copy-inputs"),
}
"""Hack families by name: what validation reports played and skipped (author adversaries are
the family "author")."""
_FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}
_HACKS = [replace(hack, family=_FAMILY_OF[hack.name]) for hack in _HACKS]

HACKS: dict[str, Hack] = {hack.name: hack for hack in _HACKS}
"""Every built-in hack by name (`corral validate --adversarial` runs those that apply to the
env's kind: `Hack.kinds`)."""
