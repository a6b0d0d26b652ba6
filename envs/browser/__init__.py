"""Built-in browser environments: MiniWoB-style web task families, one folder each.

Every family serves its own pages from the local task server (`corral.sandbox.browser.site`), is
procedurally varied by a seed, decides its reward from page or server state after the episode,
and has an oracle whose actions name elements by role and name (`Ref`), resolved to bids from the
latest observation. `common.py` holds the word lists and small helpers they share.
"""
