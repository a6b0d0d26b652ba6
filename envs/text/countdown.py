"""Countdown: reach a target with some of the given numbers and + - * / (each used at most once)."""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from fractions import Fraction

import corral as cr

from .answers import CONTENT_WEIGHT, FORMAT_WEIGHT, answer_region, is_exactly

__all__ = ["Countdown", "CountdownTask", "EXPRESSION_ONLY", "answer_expression", "check",
           "evaluate", "make_task"]

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv}
# how models write the operators: LaTeX and Unicode spellings of * / -
_SPELLINGS = (("\\times", "*"), ("\\cdot", "*"), ("×", "*"), ("·", "*"), ("∗", "*"),
              ("\\div", "/"), ("÷", "/"), ("−", "-"), ("\\left", ""), ("\\right", ""))
_RUN = re.compile(r"[\d\s+\-*/()]+")                        # a stretch of arithmetic
_OPERATION = re.compile(r"\d\s*\)*\s*[+\-*/]\s*\(*\s*\d")      # two numbers and an operator
EXPRESSION_ONLY = r"[\d\s+\-*/()]*\d\s*\)*\s*[+\-*/][\d\s+\-*/()]*"


class CountdownTask(cr.Task):
    numbers: list[int]
    target: int
    reference: str  # one expression that reaches the target (the oracle's answer)


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it used.
    Raises ValueError for anything but integers, + - * / and parentheses."""
    try:
        tree = ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return Fraction(_BINOPS[type(node.op)](left, right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError(f"'{ast.unparse(node)}' is not allowed")

    return walk(tree.body), used


def make_task(rng: random.Random, index: int) -> dict:
    while True:
        numbers = [rng.randint(1, 10) for _ in range(3)] + [rng.choice([10, 25, 50])]
        picked = rng.sample(numbers, k=rng.randint(2, 4))
        expression = str(picked[0])
        for number in picked[1:]:
            op = rng.choice("+-*")
            expression = (f"({expression} {op} {number})" if op != "*"
                          else f"{expression} * {number}")
        value, _ = evaluate(expression)
        if value.denominator == 1 and 1 <= value <= 500 and value not in numbers:
            wrapped = (expression.startswith("(") and expression.endswith(")")
                       and expression.count("(") == 1)
            reference = expression[1:-1] if wrapped else expression
            return {"numbers": numbers, "target": int(value), "reference": reference}


def _balanced(text: str) -> str:
    """`text` without the parentheses that close nothing or are never closed."""
    keep = [True] * len(text)
    opened: list[int] = []
    for i, ch in enumerate(text):
        if ch == "(":
            opened.append(i)
        elif ch == ")":
            if opened:
                opened.pop()
            else:
                keep[i] = False
    for i in opened:
        keep[i] = False
    return "".join(ch for ch, kept in zip(text, keep) if kept).strip()


def answer_expression(completion: str) -> str | None:
    """The expression a reply answers with: in its marked answer (`\\boxed{}`, `<answer>`,
    "Answer: ...") the first stretch of arithmetic with an operator, else the last one in the
    reply; `=` ends a stretch (`(5 + 3) * 2 = 16` answers `(5 + 3) * 2`), LaTeX and Unicode
    operators (`\\times`, `÷`) read as * and /, unmatched parentheses are dropped. None if the
    reply has no such stretch."""
    region, marked = answer_region(completion)
    for spelling, op in _SPELLINGS:
        region = region.replace(spelling, op)
    found = [_balanced(run) for part in region.split("=") for run in _RUN.findall(part)
             if _OPERATION.search(run)]
    if not found:
        return None
    return found[0] if marked else found[-1]


def check(task: CountdownTask, expression: str) -> bool:
    """True if `expression` uses only the task's numbers (each at most once) and hits the target."""
    try:
        value, used = evaluate(expression)
    except ValueError:
        return False
    if Counter(used) - Counter(task.numbers):
        return False
    return value == task.target


@cr.environment(tasks=cr.Dataset.procedural(make_task, size=100_000).held_out(0.1),
                task_type=CountdownTask, max_turns=1)
class Countdown(cr.TextEnv):
    """Reach a target number with the given numbers and + - * /.

    `reaches_target` (weight 0.8) checks the expression the reply answers with
    (`answer_expression`: `(5 + 3) * 2 = 16`, `$5 \\times 3$` and "Answer: 50 - 3" count);
    `format` (weight 0.2) pays the requested form, the expression alone. Solved means the
    target is reached (`pass_threshold` 0.8), whatever the form."""

    pass_threshold = CONTENT_WEIGHT

    def instruction(self, task: CountdownTask) -> str:
        numbers = ", ".join(map(str, task.numbers))
        return (f"Using some of the numbers {numbers} (each at most once) and + - * / with "
                f"parentheses, make {task.target}. Reply with the expression only.")

    @cr.reward(weight=CONTENT_WEIGHT)
    def reaches_target(self, task: CountdownTask, completion: str) -> float:
        expression = answer_expression(completion)
        return float(expression is not None and check(task, expression))

    @cr.reward(weight=FORMAT_WEIGHT)
    def format(self, completion: str) -> float:
        """The reply is an expression alone, as asked."""
        return float(is_exactly(completion, EXPRESSION_ONLY))

    def solution(self, task: CountdownTask) -> str:
        return task.reference

    def random_action(self, task: CountdownTask, rng: random.Random) -> str:
        a, b = rng.sample(task.numbers, 2)
        return f"{a} {rng.choice('+-*')} {b}"
