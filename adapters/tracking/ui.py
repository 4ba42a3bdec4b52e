"""How the MLflow UI presents a sweep: MLflow's own tag names, the headline metrics, the experiment's
description and shared view (:func:`describe_experiment`), and the links ``fp8rl runs`` prints.

The experiment carries ``mlflow.experimentKind = custom_model_development`` (the UI opens it as a
model-training experiment, not a GenAI one) and a shared view (``mlflow.sharedViewState.<key>``) whose
columns are the group tags, the :data:`HEADLINE` metrics and what the KL ones rest on (:data:`HEADLINE_BASIS`;
docs/metrics.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from .store import client, experiment_id, tracking_uri

__all__ = ["EXPERIMENT_KIND", "GROUP_TAGS", "HEADLINE", "HEADLINE_BASIS", "KL_BASIS", "MIN_KL_SEQUENCES", "NOTE", "PARENT", "SHARED_VIEW", "VIEW_KEY", "compare_url",
           "describe_experiment", "experiment_url", "headline_metrics", "headline_view", "run_url", "ui_url"]

#: MLflow's own tags: the UI's description of a run or experiment, the parent of a nested run, the kind of
#: an experiment (``custom_model_development``: "Machine learning" in the UI), a saved view of its runs table
NOTE, PARENT, EXPERIMENT_KIND, SHARED_VIEW = ("mlflow.note.content", "mlflow.parentRunId", "mlflow.experimentKind",
                                               "mlflow.sharedViewState.")
#: the key of the view :func:`describe_experiment` saves (``?viewStateShareKey=`` in :func:`experiment_url`)
VIEW_KEY = "fp8rl-headline"
#: the headline metrics of a run: (metric, column label, the run-level metric it rescales, factor) — logged
#: by ``tasks.stages.extract_kl_timing`` (:func:`headline_metrics`), in units that read in a narrow column:
#: the UI's runs table, ``fp8rl runs`` and a sweep's terminal table show these first. KL in millionths of a
#: nat (3.1e-08 nats → 0.031), |Δ log p| in thousandths, the warm step time (the steps after the first: no
#: engine start-up, no first-step warm-up)
HEADLINE = (("headline/kl_k3_micronats", "KL k3 µnats", "kl/k3", 1e6),
            ("headline/full_kl_micronats", "full KL µnats", "kl/full_kl", 1e6),
            ("headline/abs_dlogp_x1e3", "|Δlogp| ×1e3", "kl/mean_abs_logprob_diff", 1e3),
            ("headline/reward_final", "reward", "reward/final", 1.0),
            ("headline/warm_step_s", "warm step s", "time/warm_step_s", 1.0))


#: what each headline KL rests on, in the same units: (metric, the run-level metric it rescales, factor) — the
#: 95% bootstrap interval of KL k3 over the run's sampled sequences and their count (and tokens), the interval
#: of the exact probe KL over the probe sequences and their count. Shown with the KL in the terminal tables
#: (:mod:`flows.terminal_table`) and beside it in the UI's view
HEADLINE_BASIS = (("headline/kl_k3_lo_micronats", "kl/k3_lo", 1e6), ("headline/kl_k3_hi_micronats", "kl/k3_hi", 1e6),
                  ("headline/kl_sequences", "kl/sequences", 1.0), ("headline/kl_tokens", "kl/tokens", 1.0),
                  ("headline/full_kl_lo_micronats", "kl/full_kl_lo", 1e6),
                  ("headline/full_kl_hi_micronats", "kl/full_kl_hi", 1e6),
                  ("headline/full_kl_sequences", "kl/full_sequences", 1.0))


#: each headline KL → its interval's low and high end and the sequences it rests on (:data:`HEADLINE_BASIS`)
KL_BASIS = {"headline/kl_k3_micronats": ("headline/kl_k3_lo_micronats", "headline/kl_k3_hi_micronats",
                                         "headline/kl_sequences"),
            "headline/full_kl_micronats": ("headline/full_kl_lo_micronats", "headline/full_kl_hi_micronats",
                                           "headline/full_kl_sequences")}
#: the fewest sampled sequences a run's KL k3 is a finding on: below it (a two-step smoke has 32) the number
#: and its bootstrap interval over sequences are noise. The exact probe KL is no sample of the sampler's
#: draws: its interval alone says how far it holds
MIN_KL_SEQUENCES = {"headline/kl_k3_micronats": 100}


def headline_metrics(summary: Mapping[str, float]) -> dict[str, float]:
    """The :data:`HEADLINE` and :data:`HEADLINE_BASIS` metrics of a run's summary metrics (those whose source
    is there), rounded to four significant digits — a column shows ``21.95``, not ``21.947749…`` (the full
    values are the sources) — but for the counts, kept whole."""
    out = {}
    for name, src, factor in [(n, s, f) for n, _, s, f in HEADLINE] + list(HEADLINE_BASIS):
        if src in summary:
            v = float(summary[src]) * factor
            out[name] = v if name.endswith(("_sequences", "_tokens")) else float(f"{v:.4g}")
    return out


#: the tags every run of a sweep carries for grouping (the columns the shared view shows first)
GROUP_TAGS = ("model", "preset", "seed")


def describe_experiment(sweep: str, description: str = "") -> str:
    """Present the sweep's experiment in the MLflow UI as a model-training one: its description (the
    sweep's ``description``), ``mlflow.experimentKind = custom_model_development`` and the shared view
    :data:`VIEW_KEY` (runs table columns: the group tags and the :data:`HEADLINE` metrics; sorted by
    name). Returns the experiment id."""
    c = client()
    exp = experiment_id(c, sweep)
    text = f"fp8rl sweep `{sweep}`" + (f": {description}" if description else "") + (
        ". One parent run per expansion of the config (name: the sweep), its runs nested under it — "
        "model·preset·seed; headline metrics in headline/* (docs/metrics.md).")
    c.set_experiment_tag(exp, NOTE, text)
    c.set_experiment_tag(exp, EXPERIMENT_KIND, "custom_model_development")
    c.set_experiment_tag(exp, SHARED_VIEW + VIEW_KEY, json.dumps(headline_view()))
    return exp


def headline_view() -> dict:
    """The runs-table state of the shared view (the UI's own keys): the columns it shows, the runs sorted
    by KL (which lists them flat, not folded under their parent)."""
    metrics = [f"metrics.`{m}`" for m, *_ in HEADLINE]
    basis = [f"metrics.`{m}`" for m, *_ in HEADLINE_BASIS]
    cols = metrics + basis + [f"tags.`{t}`" for t in GROUP_TAGS]  # the description is on the run's page (and its name's tooltip)
    return {"selectedColumns": cols, "orderByKey": metrics[0], "orderByAsc": True, "runsHiddenMode": "SHOW_ALL",
            "hideEmptyCharts": True}



def ui_url() -> str:
    """Where the MLflow UI of the store is: the tracking server itself, else ``fp8rl ui``'s address."""
    uri = tracking_uri()
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"


def experiment_url(experiment: str, base: str | None = None) -> str:
    """The experiment's runs in the UI, with the shared headline view and as model training."""
    return f"{base or ui_url()}/#/experiments/{experiment}/runs?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"


def run_url(experiment: str, mlflow_run: str, base: str | None = None) -> str:
    """One run's page in the UI."""
    return f"{base or ui_url()}/#/experiments/{experiment}/runs/{mlflow_run}"


def compare_url(experiment: str, runs: Iterable[str], base: str | None = None) -> str:
    """MLflow's compare page for ``runs`` (MLflow run ids) of the experiment: their params and metrics side by side."""
    from urllib.parse import quote

    ids = json.dumps(list(runs), separators=(",", ":"))
    return (f"{base or ui_url()}/#/compare-runs?runs={quote(ids)}&experiments={quote(json.dumps([experiment]))}"
            "&workflowType=machine_learning")

