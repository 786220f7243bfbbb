"""The playground at GET /: its files over HTTP (public, typed, locked to this origin), then the page itself in
headless Chromium (Debian's `chromium` and `chromium-driver`, driven by Selenium) on a real server with the default
model: a prompt that prompt lookup drafts well shows accepted draft tokens and the target's own, tau and tokens/s;
Compare shows the same text with and without speculation; with --api-key the page shows the server's 401 until
the key is typed. A screenshot goes to out/playground.png."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import pytest

from specdecode.config import DrafterConfig
from specdecode.drafters import build_drafter
from specdecode.server.service import ServerConfig, assemble
from tests.e2e.server_util import SPEC, serving, tiny_service
from tests.fakes import FIXED_ROW_COST

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "playground-key"
PROMPT = "Repeat after me: the cat sat on the mat, the cat sat on the mat."
MAX_TOKENS = 20  # enough for prompt lookup to be accepted, short for the suite's time


# -- over HTTP --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed_tiny(tiny_target):
    with serving(tiny_service(tiny_target, api_key=API_KEY)) as running:
        yield running


@pytest.mark.parametrize("path, media_type", [("/", "text/html"), ("/static/playground.js", "text/javascript"),
                                              ("/static/playground.css", "text/css")])
def test_the_page_is_public_and_typed_while_the_api_needs_the_key(keyed_tiny, path, media_type):
    reply = httpx.get(keyed_tiny.url + path)
    assert reply.status_code == 200 and reply.headers["content-type"] == f"{media_type}; charset=utf-8"
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert "connect-src 'self'" in reply.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]
    assert httpx.get(keyed_tiny.url + "/v1/models").status_code == 401
    assert not re.search(r"(src|href)=\"(https?:)?//", reply.text)  # nothing from elsewhere: works offline


def test_the_page_is_not_part_of_the_api_description(keyed_tiny):
    paths = httpx.get(keyed_tiny.url + "/openapi.json", headers={"Authorization": f"Bearer {API_KEY}"}).json()["paths"]
    assert "/" not in paths and not any(path.startswith("/static") for path in paths)
    assert httpx.post(keyed_tiny.url + "/").status_code == 405


# -- in a browser -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, or a skip saying what is missing (`make test` installs both packages where apt-get runs
    as root). Selenium is pointed at Debian's binaries: it downloads nothing."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("the browser test needs Debian's chromium and chromium-driver (`apt-get install chromium "
                    "chromium-driver` as root; `make test` does it where it can)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (requirements-test.txt)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-extensions",
                 "--no-first-run", "--window-size=1100,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def default_server(default_target):
    """Prompt lookup planning with a fixed row cost (a busy machine's timings must not decide whether it drafts)."""
    drafter = build_drafter(default_target, DrafterConfig("prompt-lookup", row_cost=FIXED_ROW_COST), SPEC)
    service = assemble(default_target, {"prompt-lookup": drafter}, "prompt-lookup",
                            ServerConfig("smollm2", max_batch=2), SPEC)
    with serving(service) as running:
        yield running


def _fill(browser, element_id: str, text: str) -> None:
    element = browser.find_element("id", element_id)
    element.clear()
    element.send_keys(text)


def _run(browser, button: str, timeout: float = 240) -> str:
    """Click a button and wait until the page's run has finished: "" when it succeeded, else the page's error line."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.execute_script("document.documentElement.dataset.state = 'idle'")
    browser.find_element("id", button).click()
    WebDriverWait(browser, timeout, poll_frequency=0.1).until(
        lambda b: b.find_element("tag name", "html").get_attribute("data-state") in ("done", "error"))
    state = browser.find_element("tag name", "html").get_attribute("data-state")
    return "" if state == "done" else _text(browser, "error")


def _text(browser, element_id: str) -> str:
    return browser.find_element("id", element_id).get_attribute("textContent")


def _script_errors(browser) -> list[str]:
    """The page's own errors (a failed request logs a network line, which is no fault of the page's)."""
    return [entry["message"] for entry in browser.get_log("browser")
            if entry["level"] == "SEVERE" and entry.get("source") != "network"]


def _wait_for_model(browser) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 30, poll_frequency=0.1).until(
        lambda b: _text(b, "model") != "model: …" or _text(b, "error"))


@pytest.mark.slow
def test_the_page_shows_speculation_at_work(browser, default_server):
    browser.get(default_server.url + "/")
    _wait_for_model(browser)
    assert _text(browser, "model") == "model: smollm2"
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", "drafter")).select_by_value("prompt-lookup")  # the server's list, from the API
    _fill(browser, "prompt", PROMPT)
    _fill(browser, "max-tokens", str(MAX_TOKENS))
    assert _run(browser, "send") == ""
    answer = browser.find_element("id", "answer")
    drafted = answer.find_elements("css selector", ".tok-draft")
    assert drafted and answer.find_elements("css selector", ".tok-target"), answer.get_attribute("innerHTML")
    assert "position" in drafted[0].get_attribute("title")
    assert float(_text(browser, "tau")) > 1.0 and float(_text(browser, "tps")) > 0
    assert int(_text(browser, "accepted")) > 0 and browser.find_elements("css selector", "#chart .bar")
    (ROOT / "out").mkdir(exist_ok=True)
    browser.save_screenshot(str(ROOT / "out" / "playground.png"))
    assert _run(browser, "compare") == ""
    with_spec, without = _text(browser, "spec-text"), _text(browser, "plain-text")
    assert with_spec and with_spec == without
    assert "identical" in _text(browser, "compare-note")
    browser.save_screenshot(str(ROOT / "out" / "playground-compare.png"))
    assert not _script_errors(browser)


@pytest.mark.slow
def test_the_page_shows_the_servers_error_lines(browser, keyed_tiny):
    """Without the key: the server's 401 message, on loading and on sending; with it the page works (and a token's
    title shows its logprob when asked for). Bad input (max tokens out of range, an empty completion prompt) shows
    the server's one-line 400."""
    browser.get(keyed_tiny.url + "/")
    _wait_for_model(browser)
    refused = "a valid API key is required"
    assert refused in _text(browser, "error")
    browser.find_element("css selector", "input[value=completion]").click()  # the tiny model has no chat template
    _fill(browser, "prompt", "Hello")
    _fill(browser, "max-tokens", "4")
    assert refused in _run(browser, "send")
    _fill(browser, "api-key", API_KEY)
    browser.find_element("id", "logprobs").click()
    assert _run(browser, "send") == ""
    assert _text(browser, "answer") and not browser.find_element("id", "error").is_displayed()
    tokens = browser.find_elements("css selector", "#answer .tok")
    assert tokens and all("logprob " in token.get_attribute("title") for token in tokens)
    assert _text(browser, "model") == "model: tiny"
    _fill(browser, "max-tokens", "100000")
    assert "exceeds the model's context" in _run(browser, "send")
    _fill(browser, "max-tokens", "4")
    _fill(browser, "prompt", "")
    assert _run(browser, "send") == "the prompt is empty"
    assert not _script_errors(browser)
