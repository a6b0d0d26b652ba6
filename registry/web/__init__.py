"""The web catalog served by the registry server: an env list with search, and one page per
env with its dataset card, versions, tools, validation result, difficulty profile and the
command to use it. Server-rendered HTML (Jinja2 templates in this folder), no JavaScript."""

from __future__ import annotations

import datetime as _dt
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from corral.catalog import parse_id
from corral.charts import STYLE as CHART_STYLE
from corral.charts import bar_chart

from ..errors import ReleaseNotFound
from ..curation import dataset_card
from ..store import LocalStore

__all__ = ["HERE", "LocalStore", "ReleaseNotFound", "dataset_card", "env_page", "mount", "render"]

HERE = Path(__file__).parent


@lru_cache(maxsize=1)
def _templates() -> Any:
    import jinja2  # only the server needs it

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["short"] = lambda sha: sha[:12]
    env.filters["when"] = lambda ts: _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")
    env.filters["size"] = _size
    env.filters["pct"] = lambda x: "-" if x is None else f"{100 * x:.0f}%"
    env.filters["num"] = lambda x: "-" if x is None else f"{x:.3f}"
    env.filters["tojson_pretty"] = lambda x: json.dumps(x, indent=2, sort_keys=True)
    return env


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render(template: str, **context: Any) -> str:
    """Render one of this folder's templates."""
    return _templates().get_template(template).render(**context)


def env_page(store: LocalStore, env_id: str, version: str | None, base_url: str) -> str:
    """The HTML page of one env (its latest visible release unless `version` is given); an env
    whose every version is yanked gets a page saying so, with each version's yank reason."""
    ref = f"{env_id}@{version}" if version else env_id
    try:
        record = store.resolve(ref)
    except ReleaseNotFound:
        yanked = [] if version else _releases_of(store, env_id)
        if not yanked:
            raise
        # The env exists (as `check_env` and the profile API say): "not found" would be wrong.
        return render("yanked.html", env_id=env_id, versions=yanked, base_url=base_url)
    versions = [r for r in store.releases() if r.id == record.id]
    card = dataset_card(store, f"sha256:{record.sha256}")
    profiles = [(p, _difficulty_chart(p)) for p in card["profiles"]]
    validation = record.manifest.validation or {}
    return render("env.html", record=record, m=record.manifest, versions=versions,
                  profiles=profiles, validation=validation, base_url=base_url)


def _releases_of(store: LocalStore, env_id: str) -> list[Any]:
    """Every release of `env_id` (`ns/name-vN`, or `ns/name`: of any `-vN`), yanked ones too."""
    namespace, name, number = parse_id(env_id)
    return [r for r in store.releases() if r.id == env_id
            or (number is None and parse_id(r.id)[:2] == (namespace, name))]


def _histogram(profile: dict[str, Any], bins: int = 10) -> list[int]:
    """Task counts per pass-rate bin of a card's profile (as `Profile.histogram`)."""
    counts = [0] * bins
    for task in profile["per_task"]:
        counts[min(int(task["pass_rate"] * bins), bins - 1)] += 1
    return counts


def _difficulty_chart(profile: dict[str, Any], bins: int = 10) -> str:
    """The profile's tasks per pass-rate bin, as an inline SVG bar chart."""
    labels = [f"{i / bins:.1f}-{(i + 1) / bins:.1f}" for i in range(bins)]
    return bar_chart(labels, _histogram(profile, bins),
                     title=f"pass rate per task · {profile['name']}", xlabel="pass rate",
                     ylabel="tasks", why_empty="no task of this profile was played")


def mount(app: FastAPI, store: LocalStore) -> None:
    """Add the catalog pages to the registry app."""

    @app.get("/", response_class=HTMLResponse)
    def index(q: str = "") -> str:
        records = store.search(q)
        return render("index.html", records=records, q=q, total=len(records))

    @app.get("/env/{namespace}/{name}", response_class=HTMLResponse)
    def env(request: Request, namespace: str, name: str, version: str | None = None) -> Response:
        base = str(request.base_url).rstrip("/")
        try:
            return HTMLResponse(env_page(store, f"{namespace}/{name}", version, base))
        except ReleaseNotFound as exc:
            return HTMLResponse(render("missing.html", message=str(exc)), status_code=404)

    @app.get("/static/style.css")
    def style() -> Response:
        # the page's own rules, then the charts' (corral.charts draws every chart Corral shows)
        return Response((HERE / "style.css").read_text() + CHART_STYLE, media_type="text/css")
