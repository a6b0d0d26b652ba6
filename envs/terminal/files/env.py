"""Files and permissions: modes, ownership, cleaning up by pattern, symlinks, finding by size."""

from __future__ import annotations

import random

import corral as cr

from corral.envs.terminal._family import (Params, Template, TemplateFamily, family_dataset, put, q,
                                          same_text, word)

__all__ = ["CHMOD", "CHOWN", "CLEAN", "Files", "LARGEST", "LINK", "TEMPLATES"]


# chmod -----------------------------------------------------------------------------------------
def _chmod_params(rng: random.Random) -> Params:
    return {"file": f"/srv/app/{word(rng)}.sh", "mode": rng.choice(["600", "640", "700", "750",
                                                                     "711", "604"])}


CHMOD = Template(
    "chmod", _chmod_params,
    setup=lambda p: put(p["file"], "#!/bin/sh\necho ok\n", "666"),
    instruction=lambda p: f"Set the permission bits of {p['file']} to exactly {p['mode']} (octal).",
    solution=lambda p: [f"chmod {p['mode']} {q(p['file'])}"],
    check=lambda p: f'[ "$(stat -c %a {q(p["file"])})" = {p["mode"]} ]')


# delete by pattern -----------------------------------------------------------------------------
def _clean_params(rng: random.Random) -> Params:
    ext = rng.choice(["tmp", "bak", "swp"])
    keep = [f"{word(rng, 5)}.log" for _ in range(rng.randint(2, 4))]
    junk = [f"{word(rng, 5)}.{ext}" for _ in range(rng.randint(2, 5))]
    return {"root": f"/var/{word(rng, 4)}", "ext": ext, "keep": keep, "junk": junk}


def _clean_setup(p: Params) -> str:
    files = [f"{p['root']}/{n}" for n in p["keep"]] + \
            [f"{p['root']}/{'sub/' * (i % 2)}{n}" for i, n in enumerate(p["junk"])]
    return " && ".join(put(f, f"{f}\n") for f in files)


CLEAN = Template(
    "delete-by-extension", _clean_params, _clean_setup,
    instruction=lambda p: (f"Delete every file ending in .{p['ext']} anywhere under {p['root']} "
                           "(including subfolders). Leave all other files in place."),
    solution=lambda p: [f"find {q(p['root'])} -type f -name '*.{p['ext']}' -delete"],
    check=lambda p: (f"[ -z \"$(find {q(p['root'])} -name '*.{p['ext']}')\" ] && "
                     + " && ".join(f"[ -f {q(p['root'] + '/' + n)} ]" for n in p["keep"])))


# chown -----------------------------------------------------------------------------------------
def _chown_params(rng: random.Random) -> Params:
    return {"dir": f"/srv/shared/{word(rng, 5)}", "files": [word(rng, 4) for _ in range(3)]}


CHOWN = Template(
    "chown-tree", _chown_params,
    setup=lambda p: " && ".join(put(f"{p['dir']}/{'docs/' * (i % 2)}{f}.txt", f) for i, f in
                                enumerate(p["files"])),
    instruction=lambda p: (f"Make the folder {p['dir']} and everything inside it owned by user "
                           "'agent' and group 'agent'."),
    solution=lambda p: [f"chown -R agent:agent {q(p['dir'])}"],
    # owners, and nothing else changed: no file opened to everyone (`chmod -R 777`), none
    # emptied or rewritten
    check=lambda p: " && ".join([
        f"[ -z \"$(find {q(p['dir'])} \\( ! -user agent -o ! -group agent \\))\" ]",
        f"[ \"$(find {q(p['dir'])} -type f | wc -l)\" = 3 ]",
        f"[ -z \"$(find {q(p['dir'])} -perm -0002)\" ]",
        *(same_text(f"{p['dir']}/{'docs/' * (i % 2)}{f}.txt", f)
          for i, f in enumerate(p["files"]))]))


# symlink ---------------------------------------------------------------------------------------
def _link_params(rng: random.Random) -> Params:
    versions = sorted({f"1.{rng.randint(0, 9)}.{rng.randint(0, 20)}" for _ in range(4)})
    return {"versions": versions, "target": rng.choice(versions), "app": word(rng, 5)}


LINK = Template(
    "symlink", _link_params,
    setup=lambda p: " && ".join(put(f"/opt/{p['app']}/releases/{v}/VERSION", v)
                                for v in p["versions"]),
    instruction=lambda p: (f"Create a symbolic link /opt/{p['app']}/current that points to the "
                           f"release folder /opt/{p['app']}/releases/{p['target']}."),
    solution=lambda p: [f"ln -sfn /opt/{p['app']}/releases/{p['target']} /opt/{p['app']}/current"],
    check=lambda p: (f"[ -L /opt/{p['app']}/current ] && [ \"$(cat /opt/{p['app']}/current/VERSION)"
                     f"\" = {q(p['target'])} ]"))


# largest file ----------------------------------------------------------------------------------
def _largest_params(rng: random.Random) -> Params:
    names = sorted({word(rng, 5) for _ in range(5)})
    sizes = rng.sample(range(100, 5000), len(names))
    return {"dir": f"/data/{word(rng, 4)}", "sizes": dict(zip(names, sizes, strict=True))}


LARGEST = Template(
    "largest-file", _largest_params,
    setup=lambda p: " && ".join(f"mkdir -p {q(p['dir'])} && head -c {s} /dev/zero > "
                                f"{q(p['dir'] + '/' + n + '.bin')}" for n, s in p["sizes"].items()),
    instruction=lambda p: (f"Find the largest file in {p['dir']} and write its name (just the "
                           "file name, e.g. 'x.bin') to /root/answer.txt."),
    solution=lambda p: [f"ls -S {q(p['dir'])} | head -1 > /root/answer.txt"],
    check=lambda p: same_text("/root/answer.txt",
                              max(p["sizes"], key=p["sizes"].get) + ".bin"))

TEMPLATES = (CHMOD, CLEAN, CHOWN, LINK, LARGEST)


@cr.environment(tasks=family_dataset(TEMPLATES, seed=101))
class Files(TemplateFamily):
    """Files and permissions: chmod, chown, find/delete, symlinks, sizes."""

    templates = TEMPLATES
