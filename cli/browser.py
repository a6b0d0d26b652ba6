"""CLI for browser environments: `corral browser image` (the containerized-mode image) and
`corral browser observe ID` (what an agent sees after reset: a quick look at a task's page).

The main app wires these in with `register(app)`.
"""

from __future__ import annotations

import asyncio

import typer

from .common import build_image, console, fail

__all__ = ["browser_app", "image", "observe", "register"]

browser_app = typer.Typer(help="Browser environments: images and observations.",
                          no_args_is_help=True)


@browser_app.command("image")
def image(tag: str = typer.Option("corral/chromium:bookworm", help="tag to create")) -> None:
    """Build the containerized-mode Chromium image (cached: no-op if present; minutes if not)."""
    from corral.sandbox.browser.image import ensure_chromium_image

    build_image(tag, ensure_chromium_image)


@browser_app.command("observe")
def observe(env_id: str = typer.Argument(..., help="a browser environment id"),
            seed: int = typer.Option(0, min=0, help="task seed"),
            container: bool = typer.Option(False, help="run Chromium in a container")) -> None:
    """Reset a browser env and print the first observation (instruction, tabs, tree)."""
    import corral as cr

    async def run() -> str:
        overrides = {"sandbox": cr.Browser(mode="container")} if container else {}
        env = cr.make(env_id, **overrides)
        if getattr(env, "kind", None) != "browser":
            fail(f"{env_id} is a {getattr(env, 'kind', '?')} environment, not a browser one")
        try:
            text, _ = await env.areset(seed=seed)
            return text
        finally:  # the env's standalone sandbox closes its own Chromium
            await env.aclose()

    console.print(asyncio.run(run()), highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    """Add `corral browser ...` to the main app."""
    app.add_typer(browser_app, name="browser")
