"""adapters.logs: which log lines go to Prefect's API (the lines a real sweep keeps elsewhere:
tests/flows/test_pipelines.py's run)."""

from __future__ import annotations

from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

from adapters.logs import TO_API, lines_stay_off_a_temporary_api


def _to_api() -> bool:
    return get_current_settings().logging.to_api.enabled


def test_lines_stay_off_prefects_temporary_server_and_go_to_a_real_one(monkeypatch):
    monkeypatch.delenv(TO_API, raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # no server configured: Prefect starts its own
        assert _to_api()
        with lines_stay_off_a_temporary_api():
            assert not _to_api()
        assert _to_api()  # only within the block
    with temporary_settings(updates={PREFECT_API_URL: "http://prefect.example:4200/api"}):  # a Prefect server
        with lines_stay_off_a_temporary_api():
            assert _to_api()


def test_a_users_setting_wins(monkeypatch):
    monkeypatch.setenv(TO_API, "true")
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with lines_stay_off_a_temporary_api():
            assert _to_api()
