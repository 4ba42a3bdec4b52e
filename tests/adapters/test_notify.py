"""The team told of a bad night (adapters/notify.py): on a real Prefect server (its triggers and actions services
running, as `prefect server start` runs them) with a real HTTP receiver on loopback as the webhook, the
automations registered by `fp8rl deploy --notifications-only` — first without a webhook (one line, nothing
registered), then twice with one (no duplicate, a paused one left paused) — and a night of a deployment tagged
`nightly`, run as a process worker runs a flow run (`python -m prefect.engine`), that breaches (the event
`announce_night` emits) and fails: the receiver gets Slack-compatible JSON for both, naming the deployment, what
breached or failed and the MLflow link — and nothing for the failure of a deployment not tagged `nightly`."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from prefect import flow

from adapters import notify
from tests.flows.prefect_server import ROOT, Server

MLFLOW = "http://127.0.0.1:5000/#/experiments/7/runs"
FAILURE = "W2 grid identity: 3 tensors differ at sync 2 (planted by tests/adapters/test_notify.py)"
BREACHES = ("kl/k3 (preset all): 0.0042 outside [0.0018, 0.0026] over 10 nights; changed: vllm 0.32.0 -> 0.33.0",
            "time/sync_s: 3.10 above 1.20 over 10 nights; changed: fp8rl 535ca61 -> 0cf51cb")
WAIT_S = 90  # for both messages once the flow run ended (seconds, on the loaded 2-core machine)


@flow(name="nightly-correctness")
def a_bad_night(mlflow_url: str, breach: bool = True) -> None:
    """What the nightly flow does on a night that breaches and then fails: its MLflow link on its flow run, the
    breach event (``breach``), the error."""
    assert notify.mark_night(mlflow_url)
    if breach:
        notify.announce_night("nightly-correctness/default", "breached", BREACHES, mlflow_url)
    raise RuntimeError(FAILURE)


# creates two deployments of a_bad_night and a flow run of each, as the server's scheduler would, and prints their
# ids: `nightly-correctness/default` tagged as deployments/prefect.yaml's, and `not-nightly`, whose failure (without
# a breach) no automation matches
DEPLOY = """
import sys
from prefect import get_client
from tests.adapters.test_notify import MLFLOW, a_bad_night
with get_client(sync_client=True) as c:
    flow_id = c.create_flow(a_bad_night)
    for name, tags in (("not-nightly", ["fp8rl", "sweep"]), ("default", ["fp8rl", "nightly"])):
        deployment = c.create_deployment(flow_id=flow_id, name=name, path=sys.argv[1], tags=tags,
                                         entrypoint="tests/adapters/test_notify.py:a_bad_night",
                                         parameters={"mlflow_url": MLFLOW, "breach": name == "default"})
        print(c.create_flow_run_from_deployment(deployment).id)
"""


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread: every POST's (path, content type, body), in order."""

    def __init__(self):
        got: queue.Queue = queue.Queue()
        self.got = got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                got.put((self.path, self.headers.get("Content-Type"), body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/fp8rl"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def messages(self, n: int, timeout: float) -> list[tuple[str, str | None, bytes]]:
        deadline, out = time.monotonic() + timeout, []
        while len(out) < n and time.monotonic() < deadline:
            try:
                out.append(self.got.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                break
        return out


@pytest.fixture()
def server(tmp_path):
    s = Server(tmp_path, pool="fp8rl-notify")
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture()
def receiver():
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _deploy(server: Server, **env: str) -> subprocess.CompletedProcess:
    """`fp8rl deploy --notifications-only` in its own process, against ``server``."""
    return subprocess.run([sys.executable, "-m", "flows.cli", "deploy", "--notifications-only"], cwd=ROOT,
                          env=server.env | env, capture_output=True, text=True, timeout=120)


def _enable(server: Server, automation: str, enabled: bool) -> None:
    """What `prefect automation pause` / `resume` does."""
    httpx.patch(f"{server.api}/automations/{automation}", json={"enabled": enabled}, timeout=30).raise_for_status()


def _automations(server: Server) -> list[str]:
    return sorted(a["name"] for a in server.post("/automations/filter", {}))


@pytest.mark.timeout(600)
def test_a_nightly_run_that_breaches_and_fails_reaches_the_webhook_as_slack_json(server, receiver):
    off = _deploy(server)
    assert off.returncode == 0, off.stdout + off.stderr
    assert off.stdout.strip().splitlines()[-1] == notify.OFF and "Traceback" not in off.stderr
    assert _automations(server) == []

    for again in (False, True):  # registering again changes nothing: no second automation, a paused one stays paused
        on = _deploy(server, **{notify.WEBHOOK_ENV: receiver.url})
        assert on.returncode == 0 and on.stdout.strip().startswith("notifications on:"), on.stdout + on.stderr
        automation = {a["name"]: a for a in server.post("/automations/filter", {})}[notify.BREACHED_NAME]
        assert automation["enabled"] is not again
        _enable(server, automation["id"], again)  # paused after the first, resumed after the second
    assert _automations(server) == sorted([notify.FAILED_NAME, notify.BREACHED_NAME])
    blocks = server.post("/block_documents/filter", {"block_documents": {"name": {"any_": [notify.BLOCK]}}})
    assert len(blocks) == 1  # the webhook's URL is the server's, as a secret field
    assert receiver.url not in json.dumps(blocks)

    made = subprocess.run([sys.executable, "-c", DEPLOY, str(ROOT)], cwd=ROOT, env=server.env, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    other, flow_run = made.stdout.strip().splitlines()[-2:]
    for run in (other, flow_run):  # the one no automation matches first: its message, were there one, would come first
        ran = subprocess.run([sys.executable, "-m", "prefect.engine"], cwd=ROOT,
                             env=server.env | {"PREFECT__FLOW_RUN_ID": run}, capture_output=True, text=True,
                             timeout=180)
        assert FAILURE in ran.stdout + ran.stderr, ran.stdout + ran.stderr
        assert server.get(f"/flow_runs/{run}")["state_type"] == "FAILED"

    got = receiver.messages(2, WAIT_S)
    assert len(got) == 2, (f"{len(got)} of 2 messages in {WAIT_S} s; flow run logs:\n{server.flow_run_logs(flow_run)}"
                           f"\nserver log:\n{server.log.read_text()[-4000:]}")
    assert not receiver.messages(1, 3)  # nothing more: the other deployment's failure is not a nightly's
    texts = []
    for path, content_type, body in got:
        assert path == "/hooks/fp8rl" and content_type == "application/json"
        message = json.loads(body)
        assert set(message) == {"text"} and isinstance(message["text"], str)
        texts.append(message["text"])
    (breached,) = [t for t in texts if "breached" in t]
    (failed,) = [t for t in texts if "Failed" in t]
    assert breached.startswith(":warning: nightly-correctness/default breached: 2 breach(es)")
    assert all(line in breached for line in BREACHES) and f"MLflow: {MLFLOW}" in breached
    assert failed.startswith(":x: nightly-correctness/default Failed (flow run ")
    assert FAILURE in failed and f"MLflow: {MLFLOW}" in failed and "not-nightly" not in failed
