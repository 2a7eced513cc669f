"""Numbers typed into the dashboard that `int()` chokes on (a superscript digit, which `str.isdigit()` lets
through; more digits than `int()` parses) are one clear 400, in JSON under /api/, never a bare 500 with a
traceback (a refused action is said on the page it returns to); and nothing changes in Redis
(jobpool/digits.py)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from jobpool import Pool
from tests.support.dashboard import TOKEN, client_for, log_in

BAD_NUMBERS = ["²", "١٢", "9" * 5000, "", " 1", "1e3", "+1", "0x10"]


@pytest.mark.parametrize("raw", BAD_NUMBERS, ids=["superscript", "arabic-indic", "5000-digits", "empty",
                                                   "space", "exponent", "plus", "hex"])
def test_a_bad_offset_is_a_clear_400_on_pages_fragments_and_json(pool: Pool, raw: str) -> None:
    with TestClient(client_for(pool).app, base_url="http://localhost:8765",
                    raise_server_exceptions=False) as c:
        for path in ("/jobs", "/fragments/jobs", "/api/jobs"):
            r = c.get(path, params={"state": "queued", "offset": raw})
            assert r.status_code == 400, (path, r.status_code, r.text[:200])
            if path.startswith("/api/"):
                assert r.headers["content-type"] == "application/json"
                error = r.json()["error"]
            else:
                assert r.headers["content-type"].startswith("text/html")
                error = r.text
            assert "offset must be a whole number from 0 to" in error
            assert "Traceback" not in r.text and len(r.text) < 20_000, path


@pytest.mark.parametrize("raw", ["²", "9" * 5000, "\u0661"],
                         ids=["superscript", "5000-digits", "arabic-indic"])
def test_a_bad_slots_number_in_the_form_is_refused_and_changes_nothing(pool: Pool, raw: str) -> None:
    pool.set_slots(2)
    with client_for(pool, TOKEN) as base:
        c = TestClient(base.app, base_url="http://localhost:8765", raise_server_exceptions=False,
                       cookies=base.cookies, headers={"origin": "http://localhost:8765"})
        csrf = log_in(c)
        r = c.post("/actions/slots", data={"csrf": csrf, "slots": raw},
                   headers={"origin": "http://localhost:8765"}, follow_redirects=False)
        assert r.status_code == 303, (r.status_code, r.text[:200])  # refused input is said on the page
        page = c.get(r.headers["location"]).text
        assert "refused: slots must be a whole number from 0 to" in page and "Traceback" not in page
    assert pool.slots()[1] == 2


def test_a_good_offset_still_pages(pool: Pool) -> None:
    with client_for(pool) as c:
        r = c.get("/api/jobs", params={"state": "queued", "offset": "0"})
        assert r.status_code == 200 and r.json()["offset"] == 0
