"""The config verl composed for a run (Hydra's ``.hydra/config.yaml`` in the run's work folder) is the one
logged beside its log: the newest attempt's, none before verl got that far."""

from __future__ import annotations

import os

from tasks.verl_run import composed_config


def test_the_newest_attempts_composed_config_is_the_runs(tmp_path):
    assert composed_config(tmp_path) is None  # verl never started: nothing to log
    first = tmp_path / "outputs" / "2026-12-03" / "23-59-58" / ".hydra" / "config.yaml"
    second = tmp_path / "outputs" / "2026-12-04" / "00-00-03" / ".hydra" / "config.yaml"
    for f, text, when in ((first, "attempt: 1\n", 1_000), (second, "attempt: 2\n", 2_000)):
        f.parent.mkdir(parents=True)
        f.write_text(text)
        os.utime(f, (when, when))
    (tmp_path / "outputs" / "2026-12-04" / "00-00-03" / ".hydra" / "overrides.yaml").write_text("- a=1\n")
    assert composed_config(tmp_path) == second  # a port-race retry's config, not the first attempt's
    os.utime(first, (3_000, 3_000))
    assert composed_config(tmp_path) == first  # by when it was written, not by its folder's name
