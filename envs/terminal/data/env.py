"""Data wrangling with CSV and JSON: filter rows, convert formats, aggregate, find maxima."""

from __future__ import annotations

import csv
import io
import json
import random

import corral as cr

from corral.envs.terminal._family import (Params, Template, TemplateFamily, family_dataset, put, q,
                                          same_number, same_text, word)

__all__ = ["BEST", "CITIES", "CONVERT", "CONVERT_SRC", "DataWrangling", "FILTER", "GROUP",
           "GROUP_SRC", "STATUSES", "TEMPLATES", "TOTAL", "TOTAL_SRC"]

CITIES = ["Lyon", "Oslo", "Quito", "Perth", "Accra", "Osaka"]
STATUSES = ["paid", "pending", "shipped", "refunded"]


def _people(rng: random.Random) -> list[dict[str, object]]:
    return [{"name": word(rng, 6).capitalize(), "age": rng.randint(18, 80),
             "city": rng.choice(CITIES)} for _ in range(rng.randint(8, 16))]


def _csv(rows: list[dict[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _json_equals(path: str, expected: object) -> str:
    """Bash test: the JSON in `path` equals `expected` (formatting ignored)."""
    # -I -S: no .pth file, sitecustomize or environment variable the agent set takes part
    return (f"python3 -I -S -c 'import json,sys; sys.exit(json.load(open(sys.argv[1])) != "
            f"json.loads(sys.argv[2]))' {q(path)} {q(json.dumps(expected))}")


# filter CSV rows -------------------------------------------------------------------------------
def _filter_params(rng: random.Random) -> Params:
    rows = _people(rng)
    return {"rows": rows, "city": rng.choice([r["city"] for r in rows])}


FILTER = Template(
    "csv-filter", _filter_params,
    setup=lambda p: put("/root/people.csv", _csv(p["rows"])),
    instruction=lambda p: ("/root/people.csv has columns name,age,city. Write the header and "
                           f"only the rows whose city is {p['city']}, in their original order, "
                           "to /root/filtered.csv."),
    solution=lambda p: [f"awk -F, 'NR==1 || $3==\"{p['city']}\"' /root/people.csv > "
                        "/root/filtered.csv"],
    check=lambda p: same_text("/root/filtered.csv",
                              _csv(p["rows"][:1]).splitlines()[0] + "\n" + "".join(
                                  _csv([r]).splitlines()[1] + "\n" for r in p["rows"]
                                  if r["city"] == p["city"])))


# CSV to JSON -----------------------------------------------------------------------------------
CONVERT_SRC = ("import csv, json; rows = list(csv.DictReader(open('/root/people.csv'))); "
               "[r.update(age=int(r['age'])) for r in rows]; "
               "json.dump(rows, open('/root/people.json', 'w'))")

CONVERT = Template(
    "csv-to-json", lambda rng: {"rows": _people(rng)},
    setup=lambda p: put("/root/people.csv", _csv(p["rows"])),
    instruction=lambda p: ("Convert /root/people.csv (columns name,age,city) to /root/people.json:"
                           " a JSON array with one object per row, keys name, age, city, and age "
                           "as a number."),
    solution=lambda p: [f"python3 -c {q(CONVERT_SRC)}"],
    check=lambda p: _json_equals("/root/people.json", p["rows"]))


# total of a JSON array -------------------------------------------------------------------------
def _total_params(rng: random.Random) -> Params:
    items = [{"sku": word(rng, 4).upper(), "price": rng.randint(1, 50),
              "qty": rng.randint(1, 9)} for _ in range(rng.randint(3, 8))]
    return {"items": items}


TOTAL_SRC = ("import json; items = json.load(open('/root/cart.json'))['items']; "
             "print(sum(i['price'] * i['qty'] for i in items))")

TOTAL = Template(
    "json-total", _total_params,
    setup=lambda p: put("/root/cart.json", json.dumps({"items": p["items"]}, indent=2)),
    instruction=lambda p: ("/root/cart.json holds {\"items\": [{\"sku\", \"price\", \"qty\"}, "
                           "...]}. Write the cart total, the sum of price*qty over all items (an "
                           "integer), to /root/total.txt."),
    solution=lambda p: [f"python3 -c {q(TOTAL_SRC)} > /root/total.txt"],
    check=lambda p: same_number("/root/total.txt",
                              str(sum(i["price"] * i["qty"] for i in p["items"]))))


# group and count -------------------------------------------------------------------------------
def _group_params(rng: random.Random) -> Params:
    orders = [{"id": i + 1, "status": rng.choice(STATUSES)} for i in range(rng.randint(6, 15))]
    return {"orders": orders}


def _counts(orders: list[dict[str, object]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for order in orders:
        counts[str(order["status"])] = counts.get(str(order["status"]), 0) + 1
    return counts


GROUP_SRC = ("import json, collections; orders = json.load(open('/root/orders.json')); "
             "json.dump(collections.Counter(o['status'] for o in orders), "
             "open('/root/counts.json', 'w'))")

GROUP = Template(
    "json-group-count", _group_params,
    setup=lambda p: put("/root/orders.json", json.dumps(p["orders"])),
    instruction=lambda p: ("/root/orders.json is a JSON array of orders with a 'status' field. "
                           "Write a JSON object mapping each status to its number of orders to "
                           "/root/counts.json."),
    solution=lambda p: [f"python3 -c {q(GROUP_SRC)}"],
    check=lambda p: _json_equals("/root/counts.json", _counts(p["orders"])))


# best score in JSON Lines ----------------------------------------------------------------------
def _best_params(rng: random.Random) -> Params:
    names = sorted({word(rng, 5) for _ in range(8)})
    scores = rng.sample(range(0, 1000), len(names))
    return {"scores": dict(zip(names, scores, strict=True))}


BEST = Template(
    "jsonl-max", _best_params,
    setup=lambda p: put("/root/scores.jsonl", "".join(
        json.dumps({"user": n, "score": s}) + "\n" for n, s in p["scores"].items())),
    instruction=lambda p: ("/root/scores.jsonl has one JSON object per line with 'user' and "
                           "'score'. Write the user with the highest score to /root/best.txt."),
    solution=lambda p: ["python3 -c \"import json; rows = [json.loads(l) for l in open("
                        "'/root/scores.jsonl')]; print(max(rows, key=lambda r: r['score'])"
                        "['user'])\" > /root/best.txt"],
    check=lambda p: same_text("/root/best.txt", max(p["scores"], key=p["scores"].get)))

TEMPLATES = (FILTER, CONVERT, TOTAL, GROUP, BEST)


@cr.environment(tasks=family_dataset(TEMPLATES, seed=606))
class DataWrangling(TemplateFamily):
    """Data wrangling: filter CSV, convert CSV to JSON, aggregate JSON and JSON Lines."""

    templates = TEMPLATES
