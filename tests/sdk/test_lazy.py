"""`corral.lazy.lazy_exports`: the one `__getattr__`/`__dir__` the lazy packages share."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_lazy_packages_load_names_on_first_use_and_list_them() -> None:
    code = """
import sys
import corral.runner.eval as ev, corral.registry as reg, corral.runner as runner
assert 'corral.runner.eval.runs' not in sys.modules
assert 'compare' in dir(ev) and 'dataset_card' in dir(reg) and 'Runner' in dir(runner)
from corral.runner.eval.runs import compare
assert ev.compare is compare and 'corral.runner.eval.runs' in sys.modules
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_an_unknown_name_is_an_attribute_error_naming_the_package() -> None:
    import corral.runner.engines as engines

    with pytest.raises(AttributeError, match="module 'corral.runner.engines' has no attribute "
                                             "'VLLMEngien'"):
        engines.VLLMEngien  # noqa: B018
    assert not hasattr(engines, "nothing")
