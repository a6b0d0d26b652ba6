"""Git: commit work, create branches, restore files, find a commit in history, tag a release."""

from __future__ import annotations

import random

import corral as cr

from corral.envs.terminal._family import (Params, Template, TemplateFamily, family_dataset, put, q,
                                          same_text, word)

__all__ = ["BRANCH", "COMMIT", "FIND", "GIT_ID", "Git", "REPO", "RESTORE", "TAG", "TEMPLATES"]

REPO = "/root/repo"
GIT_ID = ("git config --global user.email agent@example.com && git config --global user.name "
          "Agent && git config --global init.defaultBranch main")


def _repo(files: dict[str, str], commits: list[tuple[str, dict[str, str]]] | None = None) -> str:
    """Bash creating REPO with `files` in a first commit, then one commit per (message, files)."""
    steps = [GIT_ID, f"mkdir -p {REPO}", f"cd {REPO}", "git init -q"]
    steps += [put(f"{REPO}/{name}", text) for name, text in files.items()]
    steps.append("git add -A && git commit -qm 'initial commit'")
    for message, changed in commits or []:
        steps += [put(f"{REPO}/{name}", text) for name, text in changed.items()]
        steps.append(f"git add -A && git commit -qm {q(message)}")
    return " && ".join(steps)


def _files(rng: random.Random, n: int = 3) -> dict[str, str]:
    return {f"{word(rng, 5)}.txt": f"{word(rng)} {word(rng)}\n" for _ in range(n)}


# commit ----------------------------------------------------------------------------------------
def _commit_params(rng: random.Random) -> Params:
    return {"files": _files(rng), "new": f"{word(rng, 5)}.md",
            "message": f"Add {word(rng, 5)} notes"}


COMMIT = Template(
    "commit", _commit_params,
    setup=lambda p: _repo(p["files"]) + " && " + put(f"{REPO}/{p['new']}", "notes\n")
    + " && " + put(f"{REPO}/{next(iter(p['files']))}", "changed\n"),
    instruction=lambda p: (f"The git repository {REPO} has uncommitted changes (a modified file "
                           f"and a new file). Commit all of them in one commit with the message "
                           f"'{p['message']}'."),
    solution=lambda p: [f"cd {REPO} && git add -A && git commit -qm {q(p['message'])}"],
    check=lambda p: (f"cd {REPO} && [ \"$(git log -1 --format=%s)\" = {q(p['message'])} ] && "
                     f"[ -z \"$(git status --porcelain)\" ] && git cat-file -e HEAD:{p['new']} && "
                     "[ \"$(git rev-list --count HEAD)\" = 2 ]"))


# branch ----------------------------------------------------------------------------------------
def _branch_params(rng: random.Random) -> Params:
    return {"files": _files(rng), "branch": f"feature/{word(rng, 5)}"}


BRANCH = Template(
    "branch", _branch_params,
    setup=lambda p: _repo(p["files"]),
    instruction=lambda p: (f"In the git repository {REPO}, create a branch named {p['branch']} "
                           "from the current commit and switch to it."),
    solution=lambda p: [f"cd {REPO} && git switch -c {q(p['branch'])}"],
    check=lambda p: (f"cd {REPO} && [ \"$(git rev-parse --abbrev-ref HEAD)\" = {q(p['branch'])} ]"
                     " && [ \"$(git rev-parse HEAD)\" = \"$(git rev-parse main)\" ]"))


# restore one file ------------------------------------------------------------------------------
def _restore_params(rng: random.Random) -> Params:
    files = _files(rng, 4)
    broken, kept = rng.sample(sorted(files), 2)
    return {"files": files, "broken": broken, "kept": kept}


RESTORE = Template(
    "restore-file", _restore_params,
    setup=lambda p: _repo(p["files"]) + " && " + put(f"{REPO}/{p['broken']}", "garbage\n")
    + " && " + put(f"{REPO}/{p['kept']}", "work in progress\n"),
    instruction=lambda p: (f"In the git repository {REPO}, throw away the uncommitted changes to "
                           f"{p['broken']} (restore its committed version) but keep the "
                           f"uncommitted changes to {p['kept']}."),
    solution=lambda p: [f"cd {REPO} && git checkout -- {q(p['broken'])}"],
    check=lambda p: (f"cd {REPO} && git diff --quiet -- {q(p['broken'])} && "
                     + same_text(f"{REPO}/{p['kept']}", "work in progress")))


# find a commit ---------------------------------------------------------------------------------
def _find_params(rng: random.Random) -> Params:
    token = f"TOKEN_{word(rng, 8).upper()}"
    commits = [(f"Update {word(rng, 5)}", {f"{word(rng, 5)}.txt": word(rng)})
               for _ in range(rng.randint(2, 4))]
    commits.insert(rng.randint(0, len(commits)), (f"Tweak {word(rng, 5)} settings",
                                                  {"config.env": f"{token}=1\n"}))
    commits.append((f"Touch {word(rng, 5)}", {"config.env": f"{token}=1\nDEBUG=0\n"}))
    return {"files": _files(rng, 2), "commits": commits, "token": token}


FIND = Template(
    "find-commit", _find_params,
    setup=lambda p: _repo(p["files"], [tuple(c) for c in p["commits"]]),
    instruction=lambda p: (f"In the git repository {REPO}, find the commit that first added the "
                           f"line {p['token']}=1 to config.env and write its full 40-character "
                           "hash to /root/answer.txt."),
    solution=lambda p: [f"cd {REPO} && git log --reverse --format=%H -S {q(p['token'])} -- "
                        "config.env | head -1 > /root/answer.txt"],
    check=lambda p: (f"cd {REPO} && want=$(git log --format='%H %s' | grep -F "
                     f"{q(next(m for m, f in p['commits'] if 'config.env' in f))} | cut -c1-40)"
                     # a repository the agent emptied or locked gives no hash: not a match
                     " && [ ${#want} = 40 ] && "
                     "[ \"$(cat /root/answer.txt 2>/dev/null)\" = \"$want\" ]"))


# annotated tag ---------------------------------------------------------------------------------
def _tag_params(rng: random.Random) -> Params:
    commits = [(f"Release prep {word(rng, 5)}", {f"{word(rng, 5)}.txt": word(rng)})
               for _ in range(3)]
    return {"files": _files(rng, 2), "commits": commits,
            "target": rng.choice(commits)[0],
            "tag": f"v{rng.randint(1, 3)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}"}


TAG = Template(
    "tag", _tag_params,
    setup=lambda p: _repo(p["files"], [tuple(c) for c in p["commits"]]),
    instruction=lambda p: (f"In the git repository {REPO}, create an annotated tag {p['tag']} "
                           f"(any message) on the commit whose message is '{p['target']}'."),
    solution=lambda p: [f"cd {REPO} && git tag -a {p['tag']} -m {p['tag']} "
                        f"$(git log --format=%H --grep={q('^' + p['target'] + '$')})"],
    check=lambda p: (f"cd {REPO} && [ \"$(git cat-file -t {p['tag']})\" = tag ] && "
                     f"[ \"$(git log -1 --format=%s {p['tag']})\" = {q(p['target'])} ]"))

TEMPLATES = (COMMIT, BRANCH, RESTORE, FIND, TAG)


@cr.environment(tasks=family_dataset(TEMPLATES, seed=303))
class Git(TemplateFamily):
    """Git: commit, branch, restore files, search history, tag releases."""

    templates = TEMPLATES
