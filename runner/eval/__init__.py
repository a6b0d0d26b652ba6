"""`corral.runner.eval`: evaluating a model on registered envs.

* `evaluation`: `evaluate` / `aevaluate` (avg@k and pass@k on an env's eval split), `EvalResult`,
  the resumable run directory's plan and summary;
* `stats`: pass@k, failure categories, per-task and per-env summaries;
* `examples`: a few sample outputs per task, in `eval.json` and on `eval.html`;
* `report`: `eval.html` and the comparison page;
* `profile`: per-task pass rates under a model, for the dataset card (`corral profile`);
* `runs`: re-verifying and comparing finished eval runs;
* `heldout`: `score_held_out`, the in-memory one-sample score a training run takes of its policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.lazy import lazy_exports

if TYPE_CHECKING:  # editors and type checkers resolve the lazy names; nothing runs
    from corral.runner.eval.evaluation import EvalResult, aevaluate, evaluate
    from corral.runner.eval.heldout import score_held_out
    from corral.runner.eval.profile import aprofile_model
    from corral.runner.eval.runs import compare, reverify
    from corral.runner.eval.stats import pass_at_k

_LAZY = {"evaluate": "evaluation", "aevaluate": "evaluation", "EvalResult": "evaluation",
         "pass_at_k": "stats", "aprofile_model": "profile", "reverify": "runs",
         "compare": "runs", "score_held_out": "heldout"}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
