"""Validation gates publishing: a release whose validation failed is refused unless
forced, and the dataset card says what validation found (and that it was forced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.registry.build import build_release
from corral.registry.errors import ReleaseError


def test_failed_validation_refuses_the_release_unless_forced(make_env, tmp_path: Path) -> None:
    # a pass threshold of 0 makes the no-op agent "solve" every task: the verifier checks nothing
    folder, env_id = make_env(4, extra="\nEcho.pass_threshold = 0.0\n")
    with pytest.raises(ReleaseError, match="validation failed.*--force"):
        build_release(folder, validate_limit=2, out_dir=tmp_path / "refused")
    assert not list((tmp_path / "refused").glob("*.tar.gz"))
    forced = build_release(folder, validate_limit=2, force=True, out_dir=tmp_path / "forced")
    card = forced.manifest.card.validation
    assert card["ok"] == "false" and card["forced"] and card["noop"] == "100% pass"
    assert card["adversarial"] == "not run"


def test_passing_validation_is_summarised_in_the_card(make_env, tmp_path: Path) -> None:
    folder, _ = make_env(4)
    card = build_release(folder, validate_limit=2, out_dir=tmp_path).manifest.card.validation
    assert card["ok"] == "true" and "forced" not in card
    assert card["oracle"] == "100% pass over 2 tasks" and card["noop"] == "0% pass"
