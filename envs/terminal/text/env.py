"""Text processing: count matching lines, replace in place, sort/uniq, sum a column, slice lines."""

from __future__ import annotations

import random

import corral as cr

from corral.envs.terminal._family import (Params, Template, TemplateFamily, family_dataset, put,
                                          same_number, same_text, word)

__all__ = ["COUNT", "LEVELS", "REPLACE", "SLICE", "SUM", "TEMPLATES", "TextProcessing", "UNIQ"]

LEVELS = ["INFO", "WARN", "ERROR", "DEBUG"]


# count matching lines --------------------------------------------------------------------------
def _count_params(rng: random.Random) -> Params:
    lines = [f"2024-01-{rng.randint(1, 28):02d} {rng.choice(LEVELS)} {word(rng)} {word(rng, 4)}"
             for _ in range(rng.randint(15, 40))]
    return {"level": rng.choice(LEVELS), "lines": lines}


COUNT = Template(
    "count-lines", _count_params,
    setup=lambda p: put("/var/log/app.log", "\n".join(p["lines"]) + "\n"),
    instruction=lambda p: (f"Count the lines of /var/log/app.log whose level is {p['level']} and "
                           "write the number (digits only) to /root/count.txt."),
    solution=lambda p: [f"grep -c ' {p['level']} ' /var/log/app.log > /root/count.txt"],
    check=lambda p: same_number("/root/count.txt",
                              str(sum(f" {p['level']} " in line for line in p["lines"]))))


# replace in place ------------------------------------------------------------------------------
def _replace_params(rng: random.Random) -> Params:
    old, new = f"db-{word(rng, 4)}.internal", f"db-{word(rng, 4)}.internal"
    sections = [word(rng, 5) for _ in range(rng.randint(3, 5))]
    lines = []
    for name in sections:
        lines += [f"[{name}]", f"host={old if rng.random() < 0.7 else 'localhost'}",
                  f"port={rng.randint(1000, 9999)}", ""]
    if not any(line == f"host={old}" for line in lines):
        lines[1] = f"host={old}"
    return {"old": old, "new": new, "text": "\n".join(lines)}


REPLACE = Template(
    "replace-host", _replace_params,
    setup=lambda p: put("/etc/myapp/config.ini", p["text"]),
    instruction=lambda p: (f"In /etc/myapp/config.ini, change every host={p['old']} to "
                           f"host={p['new']}. Change nothing else in the file."),
    solution=lambda p: [f"sed -i 's/^host={p['old']}$/host={p['new']}/' /etc/myapp/config.ini"],
    check=lambda p: same_text("/etc/myapp/config.ini",
                              p["text"].replace(f"host={p['old']}", f"host={p['new']}")))


# sort and deduplicate --------------------------------------------------------------------------
def _uniq_params(rng: random.Random) -> Params:
    pool = [word(rng, rng.randint(3, 7)) for _ in range(8)]
    return {"words": [rng.choice(pool) for _ in range(rng.randint(15, 30))]}


UNIQ = Template(
    "sort-unique", _uniq_params,
    setup=lambda p: put("/root/words.txt", "\n".join(p["words"]) + "\n"),
    instruction=lambda p: ("/root/words.txt has one word per line, with repeats. Write each "
                           "distinct word once, sorted alphabetically, one per line, to "
                           "/root/unique.txt."),
    solution=lambda p: ["LC_ALL=C sort -u /root/words.txt > /root/unique.txt"],
    check=lambda p: same_text("/root/unique.txt", "\n".join(sorted(set(p["words"])))))


# sum a column ----------------------------------------------------------------------------------
def _sum_params(rng: random.Random) -> Params:
    regions = ["north", "south", "east", "west"]
    rows = [(rng.choice(regions), rng.randint(1, 500)) for _ in range(rng.randint(10, 25))]
    region = rng.choice(sorted({r for r, _ in rows}))
    return {"rows": rows, "region": region}


SUM = Template(
    "sum-column", _sum_params,
    setup=lambda p: put("/root/sales.tsv", "region\tamount\n"
                        + "".join(f"{r}\t{a}\n" for r, a in p["rows"])),
    instruction=lambda p: ("/root/sales.tsv is tab-separated with a header (region, amount). "
                           f"Write the total amount for region '{p['region']}' (an integer) to "
                           "/root/total.txt."),
    solution=lambda p: [f"awk -F'\\t' '$1==\"{p['region']}\" {{s+=$2}} END {{print s}}' "
                        "/root/sales.tsv > /root/total.txt"],
    check=lambda p: same_number("/root/total.txt",
                              str(sum(a for r, a in p["rows"] if r == p["region"]))))


# slice lines -----------------------------------------------------------------------------------
def _slice_params(rng: random.Random) -> Params:
    lines = [f"{i + 1}: {word(rng)}" for i in range(rng.randint(20, 40))]
    start = rng.randint(2, 10)
    return {"lines": lines, "start": start, "end": start + rng.randint(2, 8)}


SLICE = Template(
    "slice-lines", _slice_params,
    setup=lambda p: put("/root/book.txt", "\n".join(p["lines"]) + "\n"),
    instruction=lambda p: (f"Write lines {p['start']} to {p['end']} (inclusive, counting from 1) "
                           "of /root/book.txt to /root/excerpt.txt."),
    solution=lambda p: [f"sed -n '{p['start']},{p['end']}p' /root/book.txt > /root/excerpt.txt"],
    check=lambda p: same_text("/root/excerpt.txt",
                              "\n".join(p["lines"][p["start"] - 1:p["end"]])))

TEMPLATES = (COUNT, REPLACE, UNIQ, SUM, SLICE)


@cr.environment(tasks=family_dataset(TEMPLATES, seed=202).held_out(0.1))
class TextProcessing(TemplateFamily):
    """Text processing: counting, replacing, sorting, summing columns, slicing lines."""

    templates = TEMPLATES
