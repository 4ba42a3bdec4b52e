"""``fp8rl nightly``: the morning view of the nightly deployments — each one's last night, FINISHED or FAILED,
each breach of the history gate with its metric, value, band and what changed, and where the night's figures
are — and ``fp8rl nightly trust|untrust RUN`` (a night into or out of later nights' baselines). The nights are
read from MLflow (:mod:`adapters.tracking.nights`); MLflow stays the place to drill in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

__all__ = ["app", "morning_lines"]

app = typer.Typer(name="nightly", help="The nightly deployments' last nights, and a night's trust (history gate).",
                  invoke_without_command=True, add_completion=False, pretty_exceptions_enable=False)


def morning_lines(per_deployment: int = 1) -> list[str]:
    """The morning view's lines: per deployment its newest nights, each breach indented under its night."""
    from adapters import tracking
    from adapters.tracking.nights import last_nights

    found = last_nights(per_deployment)
    if not found:
        return [f"no nightly night in {tracking.tracking_uri()} yet (the nightly-correctness deployments record one "
                "each night)"]
    lines = []
    for n in found:
        when = datetime.fromtimestamp(n.start / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC") if n.start else "–"
        v = n.verdict
        status = v.status if v is not None else n.status
        head = f"{n.deployment}  {when}  {status}" + ("" if n.trusted else " (not trusted)")
        if v is not None and v.reason:
            head += f" — {v.reason}"
        lines.append(head)
        for b in v.breaches if v is not None else ():
            lines.append("  " + b.line())
        if v is not None and v.unjudged:
            lines.append("  no baseline yet for: " + ", ".join(v.unjudged))
        lines.append(f"  {v.mlflow_url if v is not None else n.mlflow_run} (figures: the run's figures/)")
    return lines


@app.callback()
def nightly(ctx: typer.Context,
            last: Annotated[int, typer.Option(min=1, help="nights per deployment, newest first")] = 1) -> None:
    """Each nightly deployment's last night: FINISHED/FAILED, each breach with metric, value, band, what changed."""
    if ctx.invoked_subcommand is None:
        for line in morning_lines(last):
            typer.echo(line)


def _trust(run: str, trusted: bool) -> None:
    from adapters.tracking.nights import set_trust

    try:
        typer.echo(set_trust(run, trusted))
    except LookupError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def trust(run: Annotated[str, typer.Argument(help="the night's MLflow run id (fp8rl nightly lists them)")]) -> None:
    """Reinstate a night: later nights take it into their baseline."""
    _trust(run, True)


@app.command()
def untrust(run: Annotated[str, typer.Argument(help="the night's MLflow run id (fp8rl nightly lists them)")]) -> None:
    """Revoke a night: no later night takes it into its baseline (it stays recorded)."""
    _trust(run, False)
