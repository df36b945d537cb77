"""The chat page `inferno serve` sends at / (inferno/serve/page/index.html), in a real browser:
Debian's chromium, driven by Playwright (its own browser download cannot be reached here;
./run-tests installs chromium). A tiny random model answers; what is checked is the page:
streaming, stop, conversations kept across a reload, settings reaching the request (a JSON
schema included), an API key asked for, errors shown, a phone's width."""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from unittest.mock import ANY

import httpx
import pytest

from inferno.serve.app import ServerConfig, build_app

from test_serve import running, wait_healthy

MODEL = "tiny"


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("the chat page's tests need Debian's chromium: apt-get install chromium (./run-tests "
                    "installs it where it can)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


@contextmanager
def serve(qwen3_dir, **extra):
    """A server of the tiny model, once healthy: (its URL, the app's state)."""
    app = build_app(ServerConfig(model=str(qwen3_dir), model_id=MODEL, parallel=2, ctx_size=512, **extra))
    with running(app) as url:
        wait_healthy(url)
        yield url, app.state.inferno


@pytest.fixture(scope="module")
def server(qwen3_dir):
    with serve(qwen3_dir) as served:
        yield served


@pytest.fixture
def page(browser, server):
    context = browser.new_context()
    page = context.new_page()
    page.goto(server[0])
    page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
    yield page
    context.close()


def settings(page, **values):
    page.click("#toggle-settings")
    for name, value in values.items():
        page.fill(f"#{name}", str(value))
    page.click("#toggle-settings")


def ask(page, text):
    page.fill("#input", text)
    page.press("#input", "Enter")


def replies(page):
    return page.locator(".msg.assistant .body")


def test_a_reply_streams_and_the_conversation_survives_a_reload(page, server, monkeypatch):
    engine = server[1].batch.engine
    run = engine.model.run  # steps 30 ms apart: the chunks reach the page one by one
    monkeypatch.setattr(engine.model, "run", lambda *a, **k: (time.sleep(0.03), run(*a, **k))[1])
    settings(page, temperature=0, max_tokens=12)
    assert "context 512 tokens" in page.text_content("#ctx")
    page.evaluate("""() => { window.changes = 0; new MutationObserver(() => window.changes++)
        .observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true}); }""")
    ask(page, "Hello there")
    page.wait_for_selector(".msg.assistant .stats")
    text = replies(page).last.text_content()
    want = httpx.post(server[0] + "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "temperature": 0,
        "max_tokens": 12}).json()["choices"][0]["message"]["content"]
    kept = page.evaluate("JSON.parse(localStorage.getItem('inferno.conversations'))[0].messages")
    assert kept == [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": want, "stats": ANY}]
    assert page.evaluate("window.changes") > 6  # drawn piece by piece, not once at the end
    assert "tokens/s" in page.text_content(".msg.assistant .stats")
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.text_content(".msg.user .body") == "Hello there" and replies(page).last.text_content() == text
    assert page.text_content("#convs li.on span") == "Hello there"


def test_reasoning_content_shows_apart_and_folds_once_answered(page):
    """A reasoning model's `delta.reasoning_content` (gpt-oss's analysis channel, as the server
    sends it): shown in its own foldable block, open while it streams, folded under the answer,
    kept across a reload. The server's reply is played back by the browser (page.route), so
    the reasoning is the page's only variable."""
    chunk = lambda delta: json.dumps({"choices": [{"index": 0, "delta": delta}]})  # noqa: E731
    events = [chunk({"role": "assistant"}), chunk({"reasoning_content": "The user asks for a capital."}),
              chunk({"reasoning_content": " France's is **Paris**."}), chunk({"content": "Paris."}),
              json.dumps({"choices": [], "timings": {"predicted_n": 3, "predicted_per_second": 50.0,
                                                      "prompt_ms": 12.0}}), "[DONE]"]
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"},
        body="".join(f"data: {e}\n\n" for e in events)))
    ask(page, "Capital of France?")
    page.wait_for_selector(".msg.assistant .stats")
    think = page.locator(".msg.assistant details.think")
    assert think.locator("summary").text_content() == "Reasoning"
    assert "The user asks for a capital. France's is Paris." in think.text_content()
    assert think.locator("strong").text_content() == "Paris"  # markdown, as the answer's
    assert think.get_attribute("open") is None  # folded: the answer came
    body = page.locator(".msg.assistant .body")
    assert body.text_content().endswith("Paris.")
    page.reload()
    page.wait_for_selector(".msg.assistant details.think")
    assert "France's is Paris." in page.text_content(".msg.assistant details.think")


def test_stop_ends_the_reply_and_frees_the_slot(page, server, monkeypatch):
    story = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story"}], "temperature": 0,
             "max_tokens": 400}
    assert httpx.post(server[0] + "/v1/chat/completions", json=story, timeout=60).json()["choices"][0][
        "finish_reason"] == "length"  # greedy, it would run to the end: only the button stops it
    engine = server[1].batch.engine
    run = engine.model.run  # each step slowed, so that the button comes while the reply runs
    monkeypatch.setattr(engine.model, "run", lambda *a, **k: (time.sleep(0.05), run(*a, **k))[1])
    settings(page, max_tokens=400, temperature=0)
    ask(page, "Tell me a long story")
    page.wait_for_function("document.querySelectorAll('.msg.assistant .body')[0]?.textContent.length > 3")
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .stats")
    assert page.text_content(".msg.assistant .stats") == "stopped" and page.is_enabled("#send")
    deadline = time.monotonic() + 10
    while server[1].batch.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server[1].batch.stats()["running"] == 0


def test_a_json_schema_constrains_the_reply(page):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    settings(page, schema=json.dumps(schema), temperature=0, max_tokens=40)
    sent = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/chat/completions") else None)
    ask(page, "Yes or no?")
    page.wait_for_selector(".msg.assistant .stats")
    assert sent[0]["response_format"] == {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    assert sent[0]["temperature"] == 0 and sent[0]["max_tokens"] == 40
    text = replies(page).last.text_content()
    try:
        assert json.loads(text)["answer"] in ("yes", "no")
    except json.JSONDecodeError:  # a random model's whitespace may run past 40 tokens: what came is on the way
        assert text.lstrip().startswith("{") and '"answer"' in text


def test_errors_are_shown_in_the_page(page):
    settings(page, max_tokens=100000)
    ask(page, "Hi")
    page.wait_for_selector(".msg.error")
    assert "exceeds the context" in page.text_content(".msg.error")
    settings(page, max_tokens=8, schema="{not json")
    ask(page, "Hi")
    page.wait_for_function("document.querySelectorAll('.msg.error').length === 2")
    assert "not valid JSON" in page.locator(".msg.error").last.text_content()
    assert page.is_enabled("#send")


def test_a_server_killed_mid_reply_is_an_error_not_a_hang(browser, qwen3_dir):
    """`inferno serve` in a process of its own (its steps slowed), killed while it streams."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    from test_serve import SLOW_SERVE
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SERVE, "serve", "-m", str(qwen3_dir), "--port", str(port),
                             "--alias", MODEL, "--ctx-size", "512"], stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        page = browser.new_page()
        page.goto(url)
        page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
        settings(page, max_tokens=400)
        ask(page, "Tell me a long story")
        page.wait_for_function("document.querySelector('.msg.assistant .body')?.textContent.length > 3")
        proc.send_signal(signal.SIGKILL)
        page.wait_for_selector(".msg.error", timeout=20000)
        assert page.is_enabled("#send") and not page.is_enabled("#stop")
        page.close()
    finally:
        proc.kill()
        proc.wait()


def test_an_api_key_is_asked_for(browser, qwen3_dir):
    with serve(qwen3_dir, api_key="sekret") as (url, _):
        page = browser.new_page()
        asked = []
        page.on("dialog", lambda d: (asked.append(d.message), d.accept("sekret")))
        page.goto(url)
        page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
        assert asked and "API key" in asked[0]
        settings(page, max_tokens=6)
        ask(page, "Hi")
        page.wait_for_selector(".msg.assistant .stats")
        assert len(asked) == 1  # kept for the next request
        page.close()


def test_conversations_new_rename_delete_on_a_phone(browser, server):
    context = browser.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    page.goto(server[0])
    page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
    assert page.is_visible("#menu") and page.locator("#side").bounding_box()["x"] < 0  # tucked away
    settings(page, max_tokens=4)
    ask(page, "first")
    page.wait_for_selector(".msg.assistant .stats")
    page.click("#menu")
    page.click("#new")
    ask(page, "second")
    page.wait_for_selector(".msg.assistant .stats")
    page.click("#menu")
    assert page.locator("#convs li").count() == 2
    page.once("dialog", lambda d: d.accept("renamed"))
    page.locator("#convs li").nth(1).locator("[data-act=rename]").click()
    assert page.locator("#convs li span").nth(1).text_content() == "renamed"
    page.once("dialog", lambda d: d.accept())
    page.locator("#convs li").nth(0).locator("[data-act=delete]").click()
    assert [t for t in page.locator("#convs li span").all_text_contents()] == ["renamed"]
    context.close()


def test_a_missing_asset_is_a_404_in_openais_shape(server):
    r = httpx.get(server[0] + "/page/nothing.js")
    assert r.status_code == 404 and "Invalid URL (GET /page/nothing.js)" in r.json()["error"]["message"]
    assert httpx.get(server[0] + "/").headers["content-type"].startswith("text/html")


def test_a_bad_store_or_import_does_not_break_the_page(page, tmp_path):
    page.evaluate("""localStorage.setItem('inferno.conversations', JSON.stringify(
        [{id: 'a', title: 5, messages: [{role: 'user', content: {}}, {role: 'user', content: 'kept'}]}, 'junk']))""")
    page.reload()
    page.wait_for_selector(".msg.user")
    assert page.text_content(".msg.user .body") == "kept" and page.text_content("#convs li span") == "Imported chat"
    bad = tmp_path / "bad.json"
    bad.write_text('[{"id": "b", "messages": [{"role": "assistant", "content": 7}], "title": null}]')
    page.set_input_files("#import", str(bad))
    page.wait_for_function("document.querySelectorAll('#convs li').length === 2")
    page.evaluate("localStorage.setItem('inferno.conversations', '{not json')")
    page.reload()
    page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
    assert page.locator("#convs li").count() == 0


def test_export_then_import_brings_the_conversations_back(page, tmp_path):
    settings(page, max_tokens=4)
    ask(page, "keep me")
    page.wait_for_selector(".msg.assistant .stats")
    with page.expect_download() as download:
        page.click("#export")
    saved = tmp_path / "conversations.json"
    download.value.save_as(saved)
    assert json.loads(saved.read_text())[0]["messages"][0] == {"role": "user", "content": "keep me"}
    page.evaluate("localStorage.clear()")
    page.reload()
    assert page.locator("#convs li").count() == 0
    page.set_input_files("#import", str(saved))
    page.wait_for_selector(".msg.user")
    assert page.text_content(".msg.user .body") == "keep me" and page.locator("#convs li").count() == 1
