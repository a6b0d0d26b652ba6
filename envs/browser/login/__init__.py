"""Log in with the given username and password."""

from __future__ import annotations

import random

import corral as cr
from corral.browser import BrowserEnv, Ref, Request, html_page
from corral.envs.browser.common import FIRST, SIZE, WORDS, WebTask, form, submitted, text_field

__all__ = ["Login", "LoginTask", "make_task"]


class LoginTask(WebTask):
    username: str
    password: str


def make_task(rng: random.Random, index: int) -> dict:
    user = f"{rng.choice(FIRST).lower()}{rng.randint(10, 999)}"
    password = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}-{rng.randint(100, 999)}"
    return {"seed": index, "username": user, "password": password}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=LoginTask,
                sandbox=cr.Browser(), max_turns=6)
class Login(BrowserEnv):
    """Log in with the given username and password."""

    def site(self, task: LoginTask) -> dict:
        fields = text_field("Username", "username") + text_field("Password", "password",
                                                                 "password")

        def login(request: Request) -> str:
            ok = (request.arg("username"), request.arg("password")) == (task.username,
                                                                        task.password)
            return html_page("Welcome" if ok else "Login failed",
                             "<h1>Welcome back!</h1>" if ok else
                             "<h1>Wrong username or password</h1><a href='/'>Try again</a>")

        return {"/": html_page("Sign in", "<h1>Sign in</h1>" + form(fields, "/login", "Log in")),
                "/login": login}

    def instruction(self, task: LoginTask) -> str:
        return (f"Log in as \"{task.username}\" with the password \"{task.password}\".")

    @cr.reward
    def logged_in(self, site, task: LoginTask) -> float:
        sent = submitted(site, "/login")
        return float(sent == {"username": task.username, "password": task.password})

    def solution(self, task: LoginTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("fill", bid=Ref("textbox", "Username"), text=task.username),
                cr.ToolCall.of("fill", bid=Ref("textbox", "Password"), text=task.password),
                cr.ToolCall.of("click", bid=Ref("button", "Log in"))]
