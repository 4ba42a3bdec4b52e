"""The team told of a bad night: the nightly deployments' Prefect automations, and the event a breaching night emits.

Two automations are declared here (:func:`automations`) and registered by ``fp8rl deploy`` (:func:`register`), each
calling a webhook with Slack-compatible JSON (``{"text": ...}``; Slack's incoming webhooks, and Mattermost's or
Rocket.Chat's, read that field):

- ``fp8rl: a nightly run failed`` — a flow run of a deployment tagged ``nightly`` (``nightly-correctness/default``,
  ``/verl``, ``upstream-drift/default``: deployments/prefect.yaml) entered Failed or Crashed. The text names the
  deployment (flow/deployment), the state, its message (the error that ended the night) and the MLflow link the
  night put on its flow run (:func:`mark_night`), with the Prefect UI's link to the flow run when the server has a UI.
- ``fp8rl: a nightly night breached`` — the event :data:`BREACHED` that :func:`announce_night` emits when the history
  gate finds a night worse than its baseline: the deployment, the status, one line per breach and the MLflow link.

The webhook's URL is no part of the repository: it lives in the Prefect server, as the Webhook block
:data:`BLOCK` (its URL a secret field), which ``fp8rl deploy`` writes from ``FP8RL_NOTIFY_WEBHOOK`` when set, or
which the user creates (Prefect's UI, ``Webhook(url=...).save("fp8rl-nightly")``). Neither: notifications are
off, which ``fp8rl deploy`` says in one line. Rendering happens in the server (the actions' Jinja templates, with
the flow run, its flow and deployment and the event in their context: Prefect's ``JinjaTemplateAction``).
Specified in docs/deploy.md (Notifications).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING
from uuid import UUID

if TYPE_CHECKING:
    from prefect.events.schemas.automations import AutomationCore
    from prefect.events.schemas.events import Event

__all__ = ["BLOCK", "BREACHED", "BREACHED_NAME", "FAILED_NAME", "MLFLOW_LABEL", "NIGHTLY_TAG", "OFF", "WEBHOOK_ENV",
           "announce_night", "automations", "mark_night", "register"]

#: the event a breaching night emits (:func:`announce_night`), which the automation :data:`BREACHED_NAME` sends on
BREACHED = "fp8rl.nightly.breached"
#: the Webhook block (in the Prefect server) the automations call
BLOCK = "fp8rl-nightly"
#: the environment variable ``fp8rl deploy`` reads the webhook's URL from
WEBHOOK_ENV = "FP8RL_NOTIFY_WEBHOOK"
#: the tag of the nightly deployments (deployments/prefect.yaml): their flow runs carry it
NIGHTLY_TAG = "nightly"
#: the flow-run label holding the night's MLflow link (:func:`mark_night`)
MLFLOW_LABEL = "fp8rl.mlflow_url"
FAILED_NAME = "fp8rl: a nightly run failed"
BREACHED_NAME = "fp8rl: a nightly night breached"

#: the failed night's message: rendered by the server with the flow run (its state as the event carried it), its
#: flow and its deployment
FAILED_PAYLOAD = """\
{%- set where = flow.name ~ "/" ~ deployment.name -%}
{%- set mlflow = flow_run.labels["MLFLOW_LABEL"] -%}
{%- set ui = flow_run | ui_url -%}
{%- set text = ":x: " ~ where ~ " " ~ flow_run.state.name ~ " (flow run " ~ flow_run.name ~ "): "
    ~ flow_run.state.message
    ~ "\\nMLflow: " ~ (mlflow if mlflow else "none recorded before the night ended (fp8rl runs)")
    ~ (("\\nPrefect: " ~ ui) if ui else "") -%}
{{ {"text": text} | tojson }}""".replace("MLFLOW_LABEL", MLFLOW_LABEL)

#: the breaching night's message: rendered by the server from the event's payload (:func:`announce_night`)
BREACHED_PAYLOAD = """\
{%- set p = event.payload -%}
{%- set text = ":warning: " ~ p["deployment"] ~ " " ~ p["status"] ~ ": " ~ (p["lines"] | length)
    ~ " breach(es)\\n" ~ (p["lines"] | join("\\n"))
    ~ "\\nMLflow: " ~ (p["mlflow_url"] if p["mlflow_url"] else "none recorded") -%}
{{ {"text": text} | tojson }}"""

OFF = (f"notifications off: no webhook configured (set {WEBHOOK_ENV} to a Slack-compatible webhook URL and run "
       f"`fp8rl deploy` again, or create a Webhook block named {BLOCK} in Prefect; docs/deploy.md, Notifications)")

log = logging.getLogger(__name__)


def automations(block_id: UUID) -> tuple[AutomationCore, ...]:
    """The two automations, calling the Webhook block ``block_id``: a nightly deployment's flow run Failed or
    Crashed; the event :data:`BREACHED`."""
    from prefect.events.actions import CallWebhook
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    failed = EventTrigger(
        expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
        match={"prefect.resource.id": "prefect.flow-run.*"},
        # a run of a deployment (not a subflow) tagged nightly
        match_related=[{"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{NIGHTLY_TAG}"},
                       {"prefect.resource.role": "deployment"}],
        posture=Posture.Reactive, threshold=1)
    breached = EventTrigger(expect={BREACHED}, posture=Posture.Reactive, threshold=1)
    return (
        AutomationCore(name=FAILED_NAME, tags=["fp8rl"], trigger=failed,
                   description="A nightly deployment's flow run failed or crashed: tell the team (adapters/notify.py).",
                   actions=[CallWebhook(block_document_id=block_id, payload=FAILED_PAYLOAD)]),
        AutomationCore(name=BREACHED_NAME, tags=["fp8rl"], trigger=breached,
                   description="A night breached its history gate: tell the team (adapters/notify.py).",
                   actions=[CallWebhook(block_document_id=block_id, payload=BREACHED_PAYLOAD)]),
    )


def _webhook_block(url: str | None) -> UUID | None:
    """The Webhook block :data:`BLOCK`'s id: written from ``url`` when given, else the one on the server, else None."""
    from prefect.blocks.webhook import Webhook

    if url:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{WEBHOOK_ENV}: not an http(s) URL (its scheme: {url.split(':', 1)[0]!r})")
        # JSON for the receivers that read the body by its type (Slack's incoming webhooks among them)
        return Webhook(url=url, headers={"Content-Type": "application/json"}).save(BLOCK, overwrite=True)
    try:
        return Webhook.load(BLOCK)._block_document_id
    except ValueError:  # "Unable to find block document named ...": none created
        return None


def register(url: str | None = None) -> str:
    """Register the automations with the Prefect server (``PREFECT_API_URL``), each by its name: an automation of that
    name updated in place (a paused one stays paused), any second one deleted — registering again changes nothing.
    ``url``: the webhook (default ``FP8RL_NOTIFY_WEBHOOK``), saved as the block :data:`BLOCK`; none, and no such
    block on the server: nothing registered. Returns the one line to print."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        return "notifications not registered: no Prefect server (PREFECT_API_URL is not set)"
    block_id = _webhook_block(url if url is not None else os.environ.get(WEBHOOK_ENV))
    if block_id is None:
        return OFF
    with get_client(sync_client=True) as client:
        for automation in automations(block_id):
            first, *extra = client.read_automations_by_name(automation.name) or [None]
            if first is None:
                client.create_automation(automation)
            else:  # a pause (prefect automation pause NAME) outlives a redeploy
                client.update_automation(first.id, automation.model_copy(update={"enabled": first.enabled}))
            for duplicate in extra:
                client.delete_automation(duplicate.id)
    return (f"notifications on: a nightly run that fails or crashes, and a night that breaches ({BREACHED}), "
            f"are sent to the webhook of the Prefect block {BLOCK} (automations '{FAILED_NAME}', '{BREACHED_NAME}')")


def mark_night(mlflow_url: str) -> bool:
    """Put the night's MLflow link on the current flow run (its label :data:`MLFLOW_LABEL`), for the failed night's
    message. Outside a flow run, or when the server refuses, nothing (False; a warning logged): a night is not
    failed for its notification."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return False
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run_labels(UUID(str(flow_run.id)), {MLFLOW_LABEL: mlflow_url})
    except Exception as e:  # noqa: BLE001 — the night goes on; its failure message then says none was recorded
        log.warning("the night's MLflow link not put on its flow run: %s", e)
        return False
    return True


def announce_night(deployment: str, status: str, lines: Sequence[str], mlflow_url: str | None) -> Event | None:
    """Emit :data:`BREACHED` for a night the history gate judged bad: ``deployment`` (as ``flow/deployment``,
    e.g. ``nightly-correctness/default``), ``status`` (the verdict's, e.g. ``breached``), ``lines`` (one per
    breach: metric, value, band, what changed), ``mlflow_url`` (the night's run). Its resource is the current flow
    run (``prefect.flow-run.<id>``, with its deployment related) or, outside one, ``fp8rl.nightly.<deployment>``.
    Returns the event, or None where Prefect emits no events (no API to send them to)."""
    from prefect.events import emit_event
    from prefect.runtime import deployment as runtime_deployment
    from prefect.runtime import flow_run

    payload = {"deployment": deployment, "status": status, "lines": [str(x) for x in lines],
               "mlflow_url": mlflow_url}
    related = []
    if flow_run.id:
        resource = {"prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                    "prefect.resource.name": str(flow_run.name)}
        if runtime_deployment.id:
            related.append({"prefect.resource.id": f"prefect.deployment.{runtime_deployment.id}",
                            "prefect.resource.role": "deployment",
                            "prefect.resource.name": str(runtime_deployment.name)})
    else:
        resource = {"prefect.resource.id": f"fp8rl.nightly.{deployment}", "prefect.resource.name": deployment}
    return emit_event(BREACHED, resource=resource, related=related or None, payload=payload)
