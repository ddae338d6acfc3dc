"""The console in a real browser: headless Chromium (Debian's chromium + chromium-driver,
driven by Selenium) against a real daemon. Files dropped into the inbox appear on the
overview without a reload; the review page shows the page image and the Markdown's
words; Retry on a failed file puts it through again; signing in with the token opens
the console; model output with script in it is shown as text and nothing runs.
Screenshots of every page go to $OCRD_TEST_ARTIFACTS (default: test-artifacts/console/
in the repository).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import pytest
from helpers import Daemon, drop, free_port, make_pdf, recall, sentence_lines, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ARTIFACTS = Path(os.environ.get("OCRD_TEST_ARTIFACTS") or
                 Path(__file__).resolve().parents[2] / "test-artifacts" / "console")


def shot(driver: object, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))  # type: ignore[attr-defined]
    return path


def text_of(driver: object, css: str) -> str:
    """The text on screen in the elements matching css, read in one step (the overview
    replaces its live part every two seconds)."""
    return driver.execute_script(  # type: ignore[attr-defined]
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => e.innerText).join('\\n');", css)


def console_daemon(root: Path, **kw: object) -> tuple[Daemon, str]:
    port = free_port()
    daemon = Daemon(root, web={"listen": f"127.0.0.1:{port}"}, **kw)
    return daemon, f"http://127.0.0.1:{port}"


def test_overview_updates_live_and_review_shows_image_and_words(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    daemon, base = console_daemon(tmp_path)
    daemon.start()
    try:
        browser.get(base + "/")
        wait_for(lambda: "ready" in text_of(browser, "#engine-state"), 30, "engine ready")
        browser.execute_script("window.ocrdSamePage = 'yes';")
        lines = {"invoice_march.pdf": [sentence_lines(3), sentence_lines(4)],
                 "delivery_note.pdf": [sentence_lines(5)]}
        for name, pages in lines.items():
            drop(make_pdf(tmp_path / name, pages), daemon.inbox / name)
        wait_for(lambda: all(n in text_of(browser, "#recent-done") for n in lines), 120,
                 "both files on the overview")
        # shown by the page's own polling: the page was never reloaded
        assert browser.execute_script("return window.ocrdSamePage;") == "yes"
        assert "tesseract" in text_of(browser, "#engine-kind")
        assert str(daemon.inbox) in text_of(browser, "#inboxes")
        shot(browser, "overview")

        browser.find_element(By.LINK_TEXT, "invoice_march.pdf").click()
        wait_for(lambda: "invoice_march.pdf" in text_of(browser, "#file-name"), 10, "review")
        images = browser.find_elements(By.CSS_SELECTOR, "img.preview")
        assert len(images) == 2
        for img in images:
            browser.execute_script("arguments[0].scrollIntoView();", img)
            wait_for(lambda img=img: browser.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth > 0;", img), 10,
                "page image loaded")
            width = browser.execute_script("return arguments[0].naturalWidth;", img)
            height = browser.execute_script("return arguments[0].naturalHeight;", img)
            assert max(width, height) <= 1600 and min(width, height) > 300
        shown = text_of(browser, "#page-1 .markdown")
        assert recall(sentence_lines(3), shown) >= 0.8, shown
        assert recall(sentence_lines(4), text_of(browser, "#page-2 .markdown")) >= 0.8
        browser.execute_script("window.scrollTo(0, 0);")
        shot(browser, "review")

        browser.get(base + "/files?state=done")
        wait_for(lambda: "delivery_note.pdf" in text_of(browser, "#files"), 10, "files list")
        assert "invoice_march.pdf" in text_of(browser, "#files")
        shot(browser, "files")
    finally:
        daemon.stop()


def test_retry_button_puts_a_failed_file_through_again(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    daemon, base = console_daemon(tmp_path, limits={"max_pages": 1})
    daemon.start()
    try:
        drop(make_pdf(tmp_path / "long.pdf", [sentence_lines(6), sentence_lines(7)]),
             daemon.inbox / "long.pdf")
        wait_for(lambda: (daemon.failed / "long.pdf.error.json").exists(), 60, "failed")
        browser.get(base + "/failed")
        assert "too_many_pages" in text_of(browser, "#failed")
        shot(browser, "failed")

        # the admin raises the limit and reloads; then one click puts the file back
        daemon.config["limits"] = {"max_pages": 10}
        daemon.write_config()
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: daemon.event("reloaded"), 30, "reload")
        # too_many_pages: the same file fails the same way unless the person says the
        # cause is gone (here: the limit raised)
        browser.find_element(By.CSS_SELECTOR, "#failed input[name=cause_gone]").click()
        browser.find_element(
            By.CSS_SELECTOR, "button[aria-label='Retry long.pdf (after removing the cause)']"
        ).click()
        wait_for(lambda: "Put back into its inbox" in text_of(browser, "#flash"), 10,
                 "retry confirmed")
        assert not (daemon.failed / "long.pdf.error.json").exists()
        browser.get(base + "/")
        wait_for(lambda: "long.pdf" in text_of(browser, "#recent-done"), 120,
                 "the retried file converted")
        assert (daemon.outbox / "long.md").exists()
        browser.get(base + "/files?q=long")
        assert "retried" in text_of(browser, "#files") and "done" in text_of(browser, "#files")
        shot(browser, "failed-retried")
    finally:
        daemon.stop()


def test_sign_in_with_the_token_opens_the_console(browser, tmp_path: Path) -> None:
    """With web.token_file set, the console asks for the token on a form (the way in off
    loopback); a wrong one is refused with a sentence, the right one opens the overview."""
    from selenium.webdriver.common.by import By

    token = "s3cret-token-0123456789abcdef"
    token_file = tmp_path / "web-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port = free_port()
    daemon = Daemon(tmp_path, web={"listen": f"127.0.0.1:{port}",
                                   "token_file": str(token_file)})
    base = f"http://127.0.0.1:{port}"
    daemon.start()
    try:
        browser.delete_all_cookies()
        browser.get(base + "/")
        wait_for(lambda: browser.current_url.endswith("/login"), 10, "the sign-in page")
        browser.find_element(By.NAME, "token").send_keys("not-the-token-0123456789")
        browser.find_element(By.CSS_SELECTOR, "form.login button").click()
        wait_for(lambda: "not the console's token" in text_of(browser, "main"), 10,
                 "the wrong token refused")
        browser.find_element(By.NAME, "token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "form.login button").click()
        wait_for(lambda: "ready" in text_of(browser, "#engine-state"), 30, "the overview")
        assert not browser.current_url.endswith("/login")
        shot(browser, "signed-in")
    finally:
        browser.delete_all_cookies()
        daemon.stop()


class FakeServer:
    """A fake `vllm serve` (tests/fake_vllm.py) on its own loop and thread: the
    model's output is whatever the test says, as a hostile page would make it say."""

    def __init__(self, text: str) -> None:
        from fake_vllm import FakeVllm

        self.fake = FakeVllm(latency=0.01, text=text)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


XSS = ("<|ref|>image<|/ref|><|det|>[[80, 60, 600, 300]]<|/det|>\n"
       "<|ref|>text<|/ref|><|det|>[[20, 20, 900, 120]]<|/det|>\n"
       "Invoice total <script>document.title='pwned'; window.ocrdXss = 1;</script> due\n\n"
       "<img src=x onerror=\"document.title='pwned-img'; window.ocrdXss = 2;\">\n\n"
       "<table><tr><td onmouseover=\"window.ocrdXss = 3\">cell</td></tr></table>\n\n"
       "[click me](javascript:window.ocrdXss=4) <a href=\"javascript:window.ocrdXss=5\">x</a>")


def test_script_in_model_output_is_shown_as_text_and_never_runs(browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    server = FakeServer(XSS)
    daemon, base = console_daemon(tmp_path, engine={
        "kind": "remote", "remote": {"urls": [server.fake.url]},
        "model": "deepseek-ai/DeepSeek-OCR-2"})
    try:
        daemon.start()
        drop(make_pdf(tmp_path / "hostile.pdf", [sentence_lines(8)]),
             daemon.inbox / "hostile.pdf")
        wait_for(lambda: (daemon.outbox / "hostile.md").exists(), 60, "converted")
        saved = (daemon.outbox / "hostile.md").read_text()
        # the attack reached ocrd, and the .md holds it inert (tags escaped where it enters)
        assert "&lt;script>document.title='pwned'" in saved and "<script>" not in saved
        browser.get(base + "/files?q=hostile")
        browser.find_element(By.LINK_TEXT, "hostile.pdf").click()
        wait_for(lambda: "hostile.pdf" in text_of(browser, "#file-name"), 10, "review")
        text = text_of(browser, "#page-1 .markdown")
        assert "<script>document.title='pwned'; window.ocrdXss = 1;</script>" in text
        assert "<img src=x onerror=" in text
        # nothing ran: no title change, no global set, no live element made from it
        assert "pwned" not in browser.title
        assert browser.execute_script("return window.ocrdXss === undefined;")
        for img in browser.find_elements(By.CSS_SELECTOR, ".markdown img"):
            browser.execute_script("arguments[0].scrollIntoView();", img)
        cell = browser.find_element(By.CSS_SELECTOR, ".markdown td")
        from selenium.webdriver.common.action_chains import ActionChains

        ActionChains(browser).move_to_element(cell).perform()
        for link in browser.find_elements(By.CSS_SELECTOR, ".markdown a"):
            assert not (link.get_attribute("href") or "").startswith("javascript:")
        assert browser.execute_script(
            "return document.querySelectorAll('.markdown script, .markdown [onerror], "
            ".markdown [onmouseover]').length;") == 0
        assert browser.execute_script("return window.ocrdXss === undefined;")
        assert "pwned" not in browser.title
        # the page's figure crop, in place in the Markdown, served by the console
        figure = browser.find_element(By.CSS_SELECTOR, "#page-1 .markdown img.figure")
        browser.execute_script("arguments[0].scrollIntoView();", figure)
        wait_for(lambda: browser.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0;", figure), 10,
            "figure loaded")
        assert (daemon.outbox / "hostile.assets" / "p0001-1.png").exists()
        browser.execute_script("window.scrollTo(0, 0);")
        shot(browser, "review-hostile")
    finally:
        daemon.stop()
        server.stop()


STRUCTURE_PAGES = {"structure-table": ("table_unruled", 1), "structure-ruled-table":
                   ("table_ruled", 2), "structure-list": ("lists", 1),
                   "structure-headings": ("headings", 1), "structure-columns":
                   ("two_column", 5), "structure-prose": ("prose", 1)}


def test_review_shows_the_page_structure(browser, tmp_path: Path) -> None:
    """Pages drawn with a known structure (tests/structure_pages.py) through the daemon
    (tesseract): the review shows each structure as HTML — a table's cells, a list's
    items, headings, columns read in order. Screenshots: structure-*.png."""
    from selenium.webdriver.common.by import By
    from structure_pages import make_page, truth_blocks

    daemon, base = console_daemon(tmp_path)
    daemon.start()
    try:
        pages = {}
        for name, (kind, seed) in STRUCTURE_PAGES.items():
            page = pages[name] = make_page(kind, seed)
            (tmp_path / f"{name}.pdf").write_bytes(page.pdf)
            drop(tmp_path / f"{name}.pdf", daemon.inbox / f"{name}.pdf")
        wait_for(lambda: all((daemon.outbox / f"{n}.md").exists() for n in pages), 300,
                 "all converted")
        for name, page in pages.items():
            browser.get(base + f"/files?q={name}")
            browser.find_element(By.LINK_TEXT, f"{name}.pdf").click()
            wait_for(lambda n=name: n in text_of(browser, "#file-name"), 10, "review")
            truth = truth_blocks(page)
            cells = browser.execute_script(
                "return Array.from(document.querySelectorAll('#page-1 .markdown tr'))"
                ".map(r => Array.from(r.children).map(c => c.innerText.trim()));")
            items = text_of(browser, "#page-1 .markdown li").split("\n")
            heads = text_of(browser, "#page-1 .markdown h1, #page-1 .markdown h2")
            shown = text_of(browser, "#page-1 .markdown")
            for block in truth:
                if block.kind == "table":
                    assert cells == block.rows, (name, cells)
                elif block.kind == "item":
                    assert any(block.text in it for it in items), (name, block.text, items)
                elif block.kind == "heading":
                    assert block.text in heads.split("\n"), (name, block.text, heads)
            if name == "structure-columns":  # paragraphs in reading order
                at = [shown.find(b.text[:40]) for b in truth if b.kind == "paragraph"]
                assert -1 not in at and at == sorted(at), (at, shown)
            section = browser.find_element(By.CSS_SELECTOR, "#page-1")
            browser.execute_script("arguments[0].scrollIntoView();", section)
            img = browser.find_element(By.CSS_SELECTOR, "#page-1 img.preview")
            wait_for(lambda img=img: browser.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth > 0;", img), 10,
                "page image loaded")
            shot(browser, name)
    finally:
        daemon.stop()
