"""Python scripting and debugging: fix a logic bug, a syntax error and a failing unit test;
write a script from a spec; repair a broken import."""

from __future__ import annotations

import random

import corral as cr

from corral.envs.terminal._family import (Params, Template, TemplateFamily, family_dataset, put, q,
                                          same_text, word)

__all__ = ["APP", "BUG", "BUGS", "FIZZ", "FIZZ_SRC", "GREET", "IMPORT", "PythonScripting",
           "SLUG_BUGGY", "SLUG_FIXED", "SLUG_TEST", "STATS", "SYNTAX", "TEMPLATES", "UNIT"]

APP = "/root/app"


def _numbers(rng: random.Random) -> list[int]:
    return [rng.randint(1, 99) for _ in range(rng.randint(4, 8))]


# logic bug -------------------------------------------------------------------------------------
BUGS = {  # (what it should compute, buggy line, fixed line)
    "mean": ("the arithmetic mean", "    return sum(xs) / (len(xs) - 1)",
             "    return sum(xs) / len(xs)"),
    "maximum": ("the largest number", "    return sorted(xs)[0]", "    return sorted(xs)[-1]"),
    "range": ("the largest minus the smallest number", "    return max(xs) - min(xs) + 1",
              "    return max(xs) - min(xs)"),
}
STATS = '''import sys


def {fn}(xs):
{body}


if __name__ == "__main__":
    print({fn}([int(a) for a in sys.argv[1:]]))
'''


def _bug_params(rng: random.Random) -> Params:
    return {"fn": rng.choice(sorted(BUGS)), "probe": _numbers(rng)}


def _bug_expect(p: Params) -> str:
    xs = p["probe"]
    value = {"mean": sum(xs) / len(xs), "maximum": max(xs), "range": max(xs) - min(xs)}[p["fn"]]
    return str(value)


BUG = Template(
    "fix-logic-bug", _bug_params,
    setup=lambda p: put(f"{APP}/stats.py", STATS.format(fn=p["fn"], body=BUGS[p["fn"]][1])),
    instruction=lambda p: (f"{APP}/stats.py should print {BUGS[p['fn']][0]} of the integers "
                           f"given as arguments (`python3 {APP}/stats.py 3 1 2`), but it has a "
                           "bug. Fix it."),
    solution=lambda p: [put(f"{APP}/stats.py", STATS.format(fn=p["fn"], body=BUGS[p["fn"]][2]))],
    check=lambda p: (f"[ \"$(python3 {APP}/stats.py {' '.join(map(str, p['probe']))})\" = "
                     f"{q(_bug_expect(p))} ]"))


# syntax error ----------------------------------------------------------------------------------
GREET = '''import sys


def greet(name){colon}
    return "{greeting}, " + name + "!"


print(greet(sys.argv[1]))
'''


def _syntax_params(rng: random.Random) -> Params:
    return {"greeting": rng.choice(["Hello", "Hi", "Welcome", "Howdy"]), "name": word(rng, 5)}


SYNTAX = Template(
    "fix-syntax-error", _syntax_params,
    setup=lambda p: put(f"{APP}/greet.py", GREET.format(colon="", greeting=p["greeting"])),
    instruction=lambda p: (f"`python3 {APP}/greet.py NAME` should print '{p['greeting']}, "
                           "NAME!' but the script does not run. Fix it."),
    solution=lambda p: [f"sed -i 's/^def greet(name)$/def greet(name):/' {APP}/greet.py"],
    check=lambda p: (f"[ \"$(python3 {APP}/greet.py {p['name']})\" = "
                     f"{q(p['greeting'] + ', ' + p['name'] + '!')} ]"))


# failing unit test -----------------------------------------------------------------------------
SLUG_BUGGY = '''def slugify(text):
    """Lowercase, words joined by '{sep}'."""
    return "{sep}".join(text.split())
'''
SLUG_FIXED = '''def slugify(text):
    """Lowercase, words joined by '{sep}'."""
    return "{sep}".join(text.lower().split())
'''
SLUG_TEST = '''import unittest

from textutil import slugify


class SlugifyTest(unittest.TestCase):
    def test_slug(self):
        self.assertEqual(slugify("{words}"), "{slug}")


if __name__ == "__main__":
    unittest.main()
'''


def _unit_params(rng: random.Random) -> Params:
    words = [word(rng, rng.randint(3, 6)).capitalize() for _ in range(3)]
    return {"sep": rng.choice(["-", "_"]), "words": " ".join(words)}


def _unit_test(p: Params) -> str:
    return SLUG_TEST.format(words=p["words"], slug=p["sep"].join(p["words"].lower().split()))


UNIT = Template(
    "make-test-pass", _unit_params,
    setup=lambda p: put(f"{APP}/textutil.py", SLUG_BUGGY.format(sep=p["sep"]))
    + " && " + put(f"{APP}/test_textutil.py", _unit_test(p)),
    instruction=lambda p: (f"The test in {APP}/test_textutil.py fails (run `cd {APP} && python3 "
                           "-m unittest`). Fix the code in textutil.py so it passes; do not "
                           "change the test."),
    solution=lambda p: [put(f"{APP}/textutil.py", SLUG_FIXED.format(sep=p["sep"]))],
    check=lambda p: (f"cd {APP} && python3 -m unittest -q test_textutil 2>/dev/null && "
                     + same_text(f"{APP}/test_textutil.py", _unit_test(p).rstrip("\n"))))


# write a script --------------------------------------------------------------------------------
def _fizz_params(rng: random.Random) -> Params:
    a, b = rng.sample([2, 3, 4, 5, 7], 2)
    return {"n": rng.randint(12, 30), "a": a, "b": b,
            "wa": word(rng, 4).capitalize(), "wb": word(rng, 4).capitalize()}


def _fizz(p: Params) -> str:
    out = []
    for i in range(1, p["n"] + 1):
        text = (p["wa"] if i % p["a"] == 0 else "") + (p["wb"] if i % p["b"] == 0 else "")
        out.append(text or str(i))
    return "\n".join(out)


FIZZ_SRC = '''n, a, b, wa, wb = {n}, {a}, {b}, "{wa}", "{wb}"
for i in range(1, n + 1):
    text = (wa if i % a == 0 else "") + (wb if i % b == 0 else "")
    print(text or i)
'''

FIZZ = Template(
    "write-script", _fizz_params,
    setup=lambda p: f"mkdir -p {APP}",
    instruction=lambda p: (f"Write a Python script {APP}/fizz.py that prints the numbers 1 to "
                           f"{p['n']}, one per line, except: multiples of {p['a']} print "
                           f"'{p['wa']}', multiples of {p['b']} print '{p['wb']}', and multiples "
                           f"of both print '{p['wa']}{p['wb']}'."),
    solution=lambda p: [put(f"{APP}/fizz.py", FIZZ_SRC.format(**p))],
    check=lambda p: (f"cd /tmp && [ \"$(python3 {APP}/fizz.py)\" = \"$(echo "
                     f"{q(_fizz(p))})\" ]"))


# broken import ---------------------------------------------------------------------------------
def _import_params(rng: random.Random) -> Params:
    return {"module": f"{word(rng, 5)}_helpers", "wrong": f"{word(rng, 5)}_helper",
            "value": rng.randint(100, 999)}


IMPORT = Template(
    "fix-import", _import_params,
    setup=lambda p: put(f"{APP}/{p['module']}.py", f"def answer():\n    return {p['value']}\n")
    + " && " + put(f"{APP}/main.py", f"from {p['wrong']} import answer\n\nprint(answer())\n"),
    instruction=lambda p: (f"`python3 {APP}/main.py` crashes with an ImportError. Fix main.py "
                           f"so it prints the value returned by answer() in {APP}/"
                           f"{p['module']}.py (do not edit that module)."),
    solution=lambda p: [f"sed -i 's/^from {p['wrong']} /from {p['module']} /' {APP}/main.py"],
    check=lambda p: (f"cd / && [ \"$(python3 {APP}/main.py)\" = {p['value']} ] && "
                     + same_text(f"{APP}/{p['module']}.py",
                                 f"def answer():\n    return {p['value']}")))

TEMPLATES = (BUG, SYNTAX, UNIT, FIZZ, IMPORT)


@cr.environment(tasks=family_dataset(TEMPLATES, seed=404))
class PythonScripting(TemplateFamily):
    """Python scripting and debugging: fix bugs, make tests pass, write small scripts."""

    templates = TEMPLATES
