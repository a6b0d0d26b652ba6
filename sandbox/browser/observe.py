"""Observations: an accessibility tree with stable element ids (bids), read in one evaluate call.

A small script walks the DOM of the active page once: it gives every element it reports a
`data-corral-bid` attribute (`a1`, `a2`, ... in document order, numbered on from the episode's
counter so a bid is never reused within an episode, even across pages), and returns each node's
role, accessible name, value and states. An element keeps its bid for as long as it lives, so
bids are stable between observations. It is one `page.evaluate` round trip that both marks
the elements and reads them (and, right after a navigation commits, first waits in the page for
the document to finish parsing) (CDP's accessibility tree alone has no ids to act on; BrowserGym
pairs it with a DOM snapshot and a marking pass); `benchmarks/browser.py` prints its cost.

Hidden subtrees (display:none, visibility:hidden, `hidden`, aria-hidden) are left out, so an
element revealed later (hover menus) gets its bid when it appears. An element without a role
that shows a pointer cursor where its parent does not (a `<span>` a script made clickable) is
reported as `generic`, so it has a bid to click.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ACT_JS", "BID_ATTR", "BID_PATTERN", "Node", "Observation", "POPUP_JS", "SETTLE_JS",
           "WALK_JS", "parse_nodes"]

BID_ATTR = "data-corral-bid"
BID_PATTERN = re.compile(r"^a\d+$")

WALK_JS = r"""
async ([start, maxText]) => {
  // called as soon as a navigation commits (reset does not wait for the DOMContentLoaded event
  // to reach Python first): let the parser finish here
  if (document.readyState === 'loading')
    await new Promise(r => document.addEventListener('DOMContentLoaded', r, {once: true}));
  const ATTR = 'data-corral-bid';
  let next = Math.max(window.__corralNext || 0, start);
  const SKIP = new Set(['SCRIPT','STYLE','NOSCRIPT','TEMPLATE','HEAD','META','LINK','svg']);
  const INPUT = {button:'button', submit:'button', reset:'button', image:'button',
    checkbox:'checkbox', radio:'radio', range:'slider', number:'spinbutton', search:'searchbox'};
  const TAGS = {BUTTON:'button', SELECT:'combobox', TEXTAREA:'textbox', OPTION:'option',
    IMG:'img', TABLE:'table', TR:'row', TH:'columnheader', TD:'cell', UL:'list', OL:'list',
    LI:'listitem', NAV:'navigation', MAIN:'main', FORM:'form', DIALOG:'dialog',
    SUMMARY:'button', H1:'heading', H2:'heading', H3:'heading', H4:'heading', H5:'heading',
    H6:'heading', LABEL:'LabelText', P:'paragraph', FIELDSET:'group', LEGEND:'legend',
    HEADER:'banner', FOOTER:'contentinfo', ASIDE:'complementary', SECTION:'region',
    PROGRESS:'progressbar', DETAILS:'group'};
  const FROM_CONTENT = new Set(['button','link','heading','option','tab','cell','columnheader',
    'menuitem','LabelText','legend','treeitem','paragraph']);
  const LEAF = new Set(['button','link','heading','option','tab','menuitem','LabelText','legend',
    'cell','columnheader','paragraph','treeitem']);
  const clip = (s, n) => { s = (s || '').replace(/\s+/g, ' ').trim();
                           return s.length > n ? s.slice(0, n - 1) + '…' : s; };
  const active = document.activeElement;
  function roleOf(el) {
    const r = el.getAttribute('role');
    if (r) return r.split(' ')[0];
    const tag = el.tagName;
    if (tag === 'A') return el.hasAttribute('href') ? 'link' : '';
    if (tag === 'INPUT') {
      const t = (el.getAttribute('type') || 'text').toLowerCase();
      if (t === 'hidden') return null;
      return INPUT[t] || 'textbox';
    }
    if (tag === 'SELECT' && (el.multiple || el.size > 1)) return 'listbox';
    return TAGS[tag] || '';
  }
  function labelOf(el) {
    const by = el.getAttribute('aria-labelledby');
    if (by) return by.split(/\s+/).map(id => { const n = document.getElementById(id);
                                               return n ? n.textContent : ''; }).join(' ');
    if (el.labels && el.labels.length) return Array.from(el.labels, l => textOf(l)).join(' ');
    return '';
  }
  function textOf(node) {  // a label's text without the controls inside it
    let out = '';
    for (const c of node.childNodes) {
      if (c.nodeType === 3) out += c.textContent;
      else if (c.nodeType === 1 && !['SELECT', 'INPUT', 'TEXTAREA', 'SCRIPT', 'STYLE']
               .includes(c.tagName)) out += ' ' + textOf(c);
    }
    return out;
  }
  function nameOf(el, role) {
    const aria = el.getAttribute('aria-label');
    if (aria) return aria;
    const label = labelOf(el);
    if (label) return label;
    if (el.tagName === 'IMG') return el.getAttribute('alt') || '';
    if (el.tagName === 'INPUT' && INPUT[(el.type || '').toLowerCase()] === 'button')
      return el.value || el.type;
    if (FROM_CONTENT.has(role)) { const t = textOf(el); if (t.trim()) return t; }
    return el.getAttribute('placeholder') || el.getAttribute('title') || '';
  }
  function valueOf(el, role) {
    if (el.tagName === 'SELECT') return Array.from(el.selectedOptions, o => o.text).join(', ');
    if (el.tagName === 'TEXTAREA' || (el.tagName === 'INPUT' && !['checkbox', 'radio']
        .includes(role) && role !== 'button'))
      return el.type === 'password' ? '•'.repeat(el.value.length) : el.value;
    if (el.isContentEditable) return el.textContent;
    return null;
  }
  function statesOf(el, role) {
    const s = [];
    if ((role === 'checkbox' || role === 'radio') && el.tagName === 'INPUT')
      s.push(el.checked ? 'checked' : 'unchecked');
    const ac = el.getAttribute('aria-checked');
    if (ac && el.tagName !== 'INPUT') s.push(ac === 'true' ? 'checked' : 'unchecked');
    if (el.disabled || el.getAttribute('aria-disabled') === 'true') s.push('disabled');
    if (el.required) s.push('required');
    if (el.readOnly && el.tagName !== 'SELECT' && 'readOnly' in el) s.push('readonly');
    if (el === active && el !== document.body) s.push('focused');
    const ex = el.getAttribute('aria-expanded');
    if (ex) s.push(ex === 'true' ? 'expanded' : 'collapsed');
    if (el.tagName === 'DETAILS') s.push(el.open ? 'expanded' : 'collapsed');
    if ((el.tagName === 'OPTION' && el.selected) || el.getAttribute('aria-selected') === 'true')
      s.push('selected');
    if (role === 'heading') s.push('level=' + (el.getAttribute('aria-level') || el.tagName[1]));
    return s.join(' ');
  }
  const nodes = [];
  // `pointer`: the parent shows a pointer cursor (a control, or a script's click target)
  function walk(parent, depth, inLeaf, pointer) {
    for (const child of parent.childNodes) {
      if (child.nodeType === 3) {
        if (!inLeaf) { const t = clip(child.textContent, 300);
                       if (t) nodes.push([depth, '', 'StaticText', t, null, '']); }
        continue;
      }
      if (child.nodeType !== 1 || SKIP.has(child.tagName)) continue;
      if (child.hidden || child.getAttribute('aria-hidden') === 'true') continue;
      if (!child.checkVisibility({visibilityProperty: true})) {
        if (getComputedStyle(child).display !== 'contents') continue;
      }
      let role = roleOf(child);
      if (role === null) continue;
      const clickable = child.hasAttribute('onclick') || child.hasAttribute('tabindex') ||
                        child.isContentEditable && child.getAttribute('contenteditable') !== null;
      let own = pointer;
      if (!role && !clickable) {  // a click target made by script shows a pointer cursor
        own = getComputedStyle(child).cursor === 'pointer';
        if (own && !pointer) role = 'generic';
      }
      if (!role && clickable) role = 'generic';
      if (!role || role === 'none' || role === 'presentation') {
        walk(child, depth, inLeaf, own);
        continue;
      }
      let bid = child.getAttribute(ATTR);
      if (!bid) { bid = 'a' + (next++); child.setAttribute(ATTR, bid); }
      const name = clip(nameOf(child, role), 120);
      nodes.push([depth, bid, role, name, valueOf(child, role), statesOf(child, role)]);
      if (child.tagName === 'SELECT') continue;  // options are listed in the value/select tool
      walk(child, depth + 1, inLeaf || (LEAF.has(role) && name !== ''),
           own || clickable || role !== 'generic' && LEAF.has(role));
    }
  }
  if (document.body) walk(document.body, 0, false, false);
  window.__corralNext = next;
  const body = document.body;
  return {next, nodes, url: location.href, title: document.title,
          text: body ? clip(body.innerText, maxText) : '',
          scroll: [Math.round(window.scrollY), Math.round(document.documentElement.scrollHeight),
                   window.innerHeight]};
}
"""

ACT_JS = r"""
([bid, op, arg]) => {
  const el = document.querySelector('[data-corral-bid="' + bid + '"]');
  if (!el) return {state: 'missing'};
  const tag = el.tagName.toLowerCase();
  const type = (el.getAttribute('type') || '').toLowerCase();
  const what = {tag, type};
  let hidden = !el.checkVisibility({visibilityProperty: true});
  for (let n = el; n && n !== document.body && !hidden; n = n.parentElement)
    if (n.hidden || n.getAttribute('aria-hidden') === 'true') hidden = true;
  if (hidden) return {state: 'hidden', ...what};
  if (el.disabled || el.closest('fieldset:disabled') || el.getAttribute('aria-disabled') === 'true')
    return {state: 'disabled', ...what};
  const fire = () => { el.dispatchEvent(new Event('input', {bubbles: true}));
                       el.dispatchEvent(new Event('change', {bubbles: true})); };
  if (op === 'fill') {
    const FILLABLE = ['', 'text', 'search', 'email', 'password', 'tel', 'url', 'number', 'date',
                      'time', 'datetime-local', 'month', 'week', 'color'];
    if (!(el.isContentEditable || tag === 'textarea'
          || (tag === 'input' && FILLABLE.includes(type))))
      return {state: 'not-editable', ...what};
    if (el.readOnly) return {state: 'readonly', ...what};
    el.focus();
    if (el.isContentEditable) { el.textContent = arg; fire(); return {state: 'done'}; }
    const proto = tag === 'textarea' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
    Object.getOwnPropertyDescriptor(proto, 'value').set.call(el, arg);  // React-safe setter
    if (el.value !== arg) return {state: 'bad-value', ...what};
    fire();
    return {state: 'done'};
  }
  if (op === 'select') {
    if (tag !== 'select') return {state: 'not-select', ...what};
    const wanted = Array.isArray(arg) ? arg : [arg];
    const options = Array.from(el.options);
    const picks = wanted.map(w => options.find(o => o.value === w || o.text.trim() === w));
    const miss = picks.findIndex(p => !p);
    if (miss >= 0) return {state: 'no-option', missing: wanted[miss],
                           options: options.map(o => o.text.trim()).slice(0, 30)};
    options.forEach(o => { o.selected = picks.includes(o); });
    fire();
    return {state: 'done'};
  }
  if (op === 'focus') { el.focus(); return {state: 'done'}; }
  if (op === 'check') {
    const box = tag === 'input' && (type === 'checkbox' || type === 'radio');
    const current = box ? el.checked : el.getAttribute('aria-checked') === 'true';
    if (!box && !['checkbox', 'radio', 'switch', 'menuitemcheckbox']
                     .includes(el.getAttribute('role')))
      return {state: 'not-checkable', ...what};
    if (current === arg) return {state: 'done'};
    if (type === 'radio' && !arg) return {state: 'radio-uncheck', ...what};
  }
  // pointer actions (click, hover, check): bring it into view, then hit-test its centre
  let r = el.getBoundingClientRect();
  if (r.top < 0 || r.left < 0 || r.bottom > innerHeight || r.right > innerWidth) {
    el.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
    r = el.getBoundingClientRect();
  }
  if (r.width === 0 || r.height === 0) return {state: 'hidden', ...what};
  const x = r.left + r.width / 2, y = r.top + r.height / 2;
  if (x < 0 || y < 0 || x > innerWidth || y > innerHeight) return {state: 'offscreen', ...what};
  const hit = document.elementFromPoint(x, y);
  if (hit && hit !== el && !el.contains(hit) && !(hit.tagName === 'LABEL' && hit.control === el)) {
    const by = hit.getAttribute('data-corral-bid');
    return {state: 'covered', ...what,
            by: hit.tagName.toLowerCase() + (hit.id ? '#' + hit.id : '')
                + (by ? ' [' + by + ']' : '')};
  }
  return {state: 'point', x, y};
}
"""

# Installed in every page of a context (pool): counts the tabs the page asked to open (links
# with a target, window.open), so `settle` knows how many new tabs to wait for.
POPUP_JS = r"""
(() => {
  let opened = 0;
  const doc = Math.random().toString(36).slice(2);
  Object.defineProperty(window, '__corralPopups', {value: () => [doc, opened]});
  const open = window.open;
  window.open = function (...args) { const w = open.apply(this, args); if (w) opened++; return w; };
  window.addEventListener('click', e => {
    const a = e.target && e.target.closest && e.target.closest('a[href][target]');
    if (a && !e.defaultPrevented && !['', '_self', '_parent', '_top'].includes(a.target)) opened++;
  });
})();
"""

# One animation frame (handlers scheduled by the action run), then [document id, popups].
SETTLE_JS = """() => new Promise(r => requestAnimationFrame(() => setTimeout(
  () => r(window.__corralPopups ? window.__corralPopups() : ['', 0]), 0)))"""


@dataclass(slots=True)
class Node:
    """One accessibility-tree node; `bid` is empty for text."""

    depth: int
    bid: str
    role: str
    name: str
    value: str | None
    states: str

    def line(self) -> str:
        head = f"[{self.bid}] {self.role}" if self.bid else self.role
        parts = [head, repr(self.name)] if self.name or self.bid else [head]
        if self.value is not None:
            parts.append(f"value={self.value!r}")
        if self.states:
            parts.append(self.states)
        return "  " * self.depth + " ".join(parts)


@dataclass
class Observation:
    """What the agent sees after reset and after every step."""

    url: str
    title: str
    nodes: list[Node]
    text: str
    tabs: list[dict[str, str]]
    active_tab: int
    scroll: tuple[int, int, int]
    error: str | None = None
    screenshot: bytes | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def axtree(self) -> str:
        """The tree as indented text, one node per line."""
        return "\n".join(node.line() for node in self.nodes)

    def render(self) -> str:
        """The observation as the text an agent reads."""
        lines = []
        for i, tab in enumerate(self.tabs):
            mark = " (active)" if i == self.active_tab else ""
            lines.append(f"Tab {i}{mark}: {tab['title']!r} {tab['url']}")
        y, height, view = self.scroll
        if height > view:
            lines.append(f"Scroll: {y}-{y + view} of {height} px")
        lines.extend(self.notes)
        if self.error:
            lines.append(f"Last action error: {self.error}")
        lines.append("Accessibility tree:")
        lines.append(self.axtree or "(empty page)")
        return "\n".join(lines)

    def as_dict(self, screenshot_b64: bool = False) -> dict[str, Any]:
        """JSON-able form (for `info["observation"]`)."""
        shot: Any = self.screenshot
        if shot is not None and screenshot_b64:
            shot = base64.b64encode(shot).decode()
        return {"url": self.url, "title": self.title, "axtree": self.axtree, "text": self.text,
                "tabs": self.tabs, "active_tab": self.active_tab, "error": self.error,
                "scroll": list(self.scroll), "screenshot": shot,
                "elements": [{"bid": n.bid, "role": n.role, "name": n.name, "value": n.value,
                              "states": n.states} for n in self.nodes if n.bid]}

    def find(self, role: str | None = None, name: str | None = None,
             nth: int = 0) -> Node | None:
        """The `nth` node (from 0) with this role and exactly this name (else the `nth` whose
        name contains it), or None; used by oracles to look bids up."""
        candidates = [n for n in self.nodes if n.bid and (role is None or n.role == role)]
        for exact in (True, False):
            found = [node for node in candidates
                     if name is None or (node.name == name if exact else name in node.name)]
            if len(found) > nth:
                return found[nth]
        return None


def parse_nodes(raw: list[list[Any]]) -> list[Node]:
    """Nodes from the walker's compact arrays."""
    return [Node(int(d), str(b), str(r), str(n), None if v is None else str(v), str(s))
            for d, b, r, n, v, s in raw]
