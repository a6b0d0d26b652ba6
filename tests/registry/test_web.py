"""The web catalog in real Chromium: the env list, search, and an env page with its dataset
card, versions, tools, validation result, difficulty histogram and the command to use it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright

from corral.sandbox.browser.chromium import CHROMIUM, LAUNCH_ARGS
from corral.registry.profiles import Profile, TaskPassRate
from corral.registry.transfer import publish


@pytest.mark.browser
async def test_catalog_pages_in_chromium(server, make_env, tmp_path: Path) -> None:
    alpha, alpha_id = make_env(12)
    beta, beta_id = make_env(7, namespace="other")
    validation = {"ok": True, "oracle_pass_rate": 1.0, "noop_pass_rate": 0.0,
                  "tasks_checked": 12, "tasks_total": 12, "backend": None}
    publish(alpha, registry=server.store, validation=validation)
    publish(alpha, registry=server.store, version="1.1.0", validation=validation)
    (beta / "corral.toml").write_text((beta / "corral.toml").read_text()
                                      .replace("Repeat a word.", "Spell birds backwards."))
    publish(beta, registry=server.store)
    server.store.record_profile(Profile(env_id=alpha_id, agent="random", tasks=[
        TaskPassRate(task_index=i, task_id=f"t{i}", runs=4, passes=i % 5) for i in range(12)]))

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                           args=list(LAUNCH_ARGS))
        try:
            page = await browser.new_page()
            await page.goto(server.url + "/")
            rows = page.locator("#env-list tbody tr")
            assert await rows.count() == 2
            assert "2 environments" in await page.locator("h1").inner_text()

            await page.fill("#search-input", "birds")
            await page.click("#search-button")
            await page.wait_for_url("**/?q=birds")
            assert await rows.count() == 1
            assert await page.locator(".env-link").inner_text() == beta_id

            await page.fill("#search-input", "echo")
            await page.click("#search-button")
            await page.wait_for_url("**/?q=echo")
            assert await rows.count() == 2
            await page.click(f"text={alpha_id}")
            await page.wait_for_url(f"**/env/{alpha_id}")

            assert alpha_id in await page.locator("#env-title").inner_text()
            assert "1.1.0" in await page.locator("#env-title").inner_text()
            use = await page.locator("#use").inner_text()
            assert f"corral install {alpha_id}@1.1.0 --registry {server.url}" in use
            card = await page.locator("#card").inner_text()
            assert "12" in card and "CC-BY-4.0" in card and "Repeat the word" in card
            assert await page.locator("#validation-verdict").inner_text() == "passed"
            assert await page.locator("#tools summary").inner_text() == \
                "spell — Spell a word letter by letter."
            assert await page.locator("#versions tbody tr").count() == 2
            bars = page.locator("#difficulty svg rect.bar")
            assert await bars.count() == 10
            heights = [float(await bars.nth(i).get_attribute("height")) for i in range(10)]
            # pass rates 0 (3 tasks), .25 (3), .5 (2), .75 (2), 1.0 (2): bins 0, 2, 5, 7, 9
            assert [i for i, h in enumerate(heights) if h > 0] == [0, 2, 5, 7, 9]
            assert heights[0] == heights[2] == max(heights) and heights[9] < heights[0]

            await page.click("#versions >> text=1.0.0")
            await page.wait_for_url("**version=1.0.0")
            assert "1.0.0" in await page.locator("#env-title").inner_text()
            response = await page.goto(server.url + "/env/acme/nothing-v1")
            assert response is not None and response.status == 404
        finally:
            await browser.close()


def test_an_env_whose_every_version_is_yanked_has_a_page_saying_so(server, make_env) -> None:
    """`/env/ns/name` of an env whose every version is yanked was a 404 "Not found", though the
    env exists (the profile API answers for it); it is its page, saying all versions are
    yanked, with each one's reason and hash. The API's resolve and card still answer 404 (no
    release resolves), and say why the same way; an env never published is still a 404."""
    folder, env_id = make_env(3)
    first = publish(folder, registry=server.store).record
    second = publish(folder, registry=server.store, version="1.1.0").record
    server.store.yank(f"{env_id}@1.0.0", reason="verifier accepts empty output")
    server.store.yank(f"{env_id}@1.1.0", reason="tasks leak the answer")
    for shown in (env_id, env_id.removesuffix("-v1")):  # `ns/name`: the latest env version
        page = httpx.get(f"{server.url}/env/{shown}")
        assert page.status_code == 200, (shown, page.text)
        assert f"All versions of {shown} are yanked" in page.text
        for text in ("verifier accepts empty output", "tasks leak the answer", first.sha256,
                     second.sha256, "1.0.0", "1.1.0"):
            assert text in page.text, (shown, text)
    for api in (f"/api/resolve?ref={env_id}", f"/api/cards/{env_id}"):
        response = httpx.get(server.url + api)
        assert response.status_code == 404 and response.json()["error"] == "ReleaseNotFound"
        assert ("every version is yanked (1.0.0: verifier accepts empty output; 1.1.0: tasks "
                "leak the answer)") in response.json()["detail"]
    assert httpx.get(f"{server.url}/api/profiles/{env_id}").status_code == 200
    assert httpx.get(f"{server.url}/env/acme/nothing-v1").status_code == 404
