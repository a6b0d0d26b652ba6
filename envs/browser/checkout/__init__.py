"""Add a product to the cart, go through the cart and checkout pages, and place the order."""

from __future__ import annotations

import json
import random
from html import escape

import corral as cr
from corral.browser import BrowserEnv, Ref, html_page
from corral.envs.browser.common import CITIES, PRODUCTS, SIZE, WebTask, person, sample, submitted

__all__ = ["CART_JS", "Checkout", "CheckoutTask", "make_task"]

CART_JS = """
const cart = () => JSON.parse(localStorage.getItem('cart') || '[]');
function add(name) { localStorage.setItem('cart', JSON.stringify([...cart(), name]));
                     render(); }
function render() {
  const link = document.getElementById('cart-link');
  if (link) link.textContent = 'Cart (' + cart().length + ')';
  const list = document.getElementById('items');
  if (list) list.innerHTML = cart().map(n => '<li>' + n + '</li>').join('') || '<li>empty</li>';
  const field = document.getElementById('order-items');
  if (field) field.value = JSON.stringify(cart());
}
render();"""


class CheckoutTask(WebTask):
    products: list[str]
    target: str
    name: str
    address: str


def make_task(rng: random.Random, index: int) -> dict:
    products = sample(rng, PRODUCTS, rng.randint(4, 8))
    address = f"{rng.randint(1, 200)} {rng.choice(('Oak', 'Elm', 'Bay', 'Hill'))} Street, " \
              f"{rng.choice(CITIES)}"
    return {"seed": index, "products": products, "target": rng.choice(products),
            "name": person(rng), "address": address}


@cr.environment(tasks=cr.Dataset.procedural(make_task, SIZE), task_type=CheckoutTask,
                sandbox=cr.Browser(), max_turns=10)
class Checkout(BrowserEnv):
    """Add a product to the cart, go through the cart and checkout pages, and order it."""

    def site(self, task: CheckoutTask) -> dict[str, str]:
        nav = "<nav><a href='/'>Shop</a> | <a id='cart-link' href='/cart'>Cart</a></nav>"
        cards = "".join(
            f"<li>{escape(p)} <button aria-label='Add {escape(p)} to cart' "
            f"onclick='add({escape(json.dumps(p))})'>Add to cart</button></li>"
            for p in task.products)
        checkout_form = (
            "<form method='post' action='/order'>"
            "<p><label>Full name <input name='name'></label></p>"
            "<p><label>Address <input name='address'></label></p>"
            "<input type='hidden' id='order-items' name='items'>"
            "<button type='submit'>Place order</button></form>")
        return {
            "/": html_page("Shop", f"{nav}<h1>Shop</h1><ul>{cards}</ul>", CART_JS),
            "/cart": html_page("Cart", f"{nav}<h1>Your cart</h1><ul id='items'></ul>"
                               "<a href='/checkout'>Checkout</a>", CART_JS),
            "/checkout": html_page("Checkout", f"{nav}<h1>Checkout</h1>{checkout_form}",
                                   CART_JS),
        }

    def instruction(self, task: CheckoutTask) -> str:
        return (f"Buy one \"{task.target}\": add it to the cart, open the cart, go to checkout "
                f"and order it for {task.name}, {task.address}.")

    @cr.reward
    def ordered(self, site, task: CheckoutTask) -> float:
        order = submitted(site, "/order")
        if order is None:
            return 0.0
        try:
            items = json.loads(order.get("items") or "[]")
        except json.JSONDecodeError:
            return 0.0
        return float(items == [task.target] and order.get("name") == task.name
                     and order.get("address") == task.address)

    def solution(self, task: CheckoutTask) -> list[cr.ToolCall]:
        return [cr.ToolCall.of("click", bid=Ref("button", f"Add {task.target} to cart")),
                cr.ToolCall.of("click", bid=Ref("link", "Cart (1)")),
                cr.ToolCall.of("click", bid=Ref("link", "Checkout")),
                cr.ToolCall.of("fill", bid=Ref("textbox", "Full name"), text=task.name),
                cr.ToolCall.of("fill", bid=Ref("textbox", "Address"), text=task.address),
                cr.ToolCall.of("click", bid=Ref("button", "Place order"))]
