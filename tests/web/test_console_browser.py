"""The console as a person uses it, in a real browser (Debian's chromium + chromium-driver
through Selenium) against a real daemon: finding a document by its words, seeing every
dropped file by name, reviewing pages upright and at full size, acting on failures,
uploading, on a phone's width and with a keyboard; axe-core (from the npm registry,
installed by scripts/test into .test-npm/) checks every page. Screenshots at desktop and
phone sizes go to $OCRD_TEST_ARTIFACTS (default test-artifacts/console/).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    Daemon,
    drop,
    free_port,
    make_pdf,
    recall,
    sentence_lines,
    text_image,
    wait_for,
)
from simulated_engines import SIMULATED

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
AXE = ROOT / ".test-npm" / "axe-core" / "axe.min.js"
ARTIFACTS = Path(os.environ.get("OCRD_TEST_ARTIFACTS") or ROOT / "test-artifacts" / "console")
DESKTOP = (1440, 1100)  # as test_web_browser's browser starts
PHONE = (390, 844)
INVOICE = ["Invoice 2291 from Office Supplies Ltd", "One toner cartridge, black, 89.00",
           "Two packs of printer paper, 12.40", "Payable within thirty days"]


def turned_pdf(path: Path) -> Path:
    """An A4 page lying upside down: its text, and a black bar at the top of the sheet
    as read (so at the bottom as it lies)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    w, h = A4
    c = canvas.Canvas(str(path), pagesize=A4)
    c.translate(w / 2, h / 2)
    c.rotate(180)
    c.rect(-w / 2 + 40, h / 2 - 90, w - 80, 50, fill=1)
    c.setFont("Helvetica", 13)
    y = 250
    for line in sentence_lines(61, 14):
        c.drawString(-250, y, line)
        y -= 22
    c.showPage()
    c.save()
    return path


class Site:
    """One daemon (tesseract, the searchable PDF too) and its console for the module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.daemon = Daemon(root, web={"listen": f"127.0.0.1:{port}"}, inboxes=[{
            "path": str(root / "inbox"), "outbox": str(root / "outbox"),
            "failed": str(root / "failed"), "archive": str(root / "archive"),
            "quiet_seconds": 1.0, "incomplete_seconds": 3600, "outputs": ["markdown", "pdf"],
        }])
        self.inbox = root / "inbox"

    def api(self, path: str) -> dict:
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return json.loads(r.read())

    def file_id(self, name: str) -> int:
        files = self.api(f"/api/files?q={name}&state=done")["files"]
        assert files, name
        return files[0]["id"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("console")
    s = Site(root)
    s.daemon.start()
    try:
        drop(make_pdf(root / "invoice.pdf", [sentence_lines(3), INVOICE]), s.inbox / "invoice.pdf")
        drop(turned_pdf(root / "turned.pdf"), s.inbox / "turned.pdf")
        drop(make_pdf(root / "locked.pdf", [sentence_lines(5)], encrypt="pw"),
             s.inbox / "locked.pdf")
        (s.inbox / "empty.pdf").write_bytes(b"")
        wait_for(lambda: (s.daemon.outbox / "invoice.md").exists() and
                 (s.daemon.outbox / "turned.md").exists() and
                 (s.daemon.failed / "locked.pdf.error.json").exists(), 240, "converted")
        wait_for(lambda: s.api("/api/search?q=toner")["total"] >= 1, 60, "indexed")
        yield s
    finally:
        s.daemon.stop()


# -- helpers --------------------------------------------------------------------------------

def text_of(driver: object, css: str) -> str:
    return driver.execute_script(  # type: ignore[attr-defined]
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => e.innerText).join('\\n');", css)


def shots(driver: object, name: str, root: Path | None = None) -> None:
    """Screenshots at desktop and phone size; at the phone's width the page must not
    run off the screen sideways. For the pictures, the test's temporary folder is shown
    as /srv/scans (only paths change, after the page's own checks)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    if root is not None:
        driver.execute_script(  # type: ignore[attr-defined]
            "const w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);"
            "for (let n = w.nextNode(); n; n = w.nextNode())"
            "  n.nodeValue = n.nodeValue.split(arguments[0]).join('/srv/scans');"
            # the live part, still refreshed, would bring the paths back: a copy stands
            # in for it (the refresh goes on updating the detached original)
            "const live = document.querySelector('[data-refresh]');"
            "if (live) live.replaceWith(live.cloneNode(true));", str(root))
    driver.save_screenshot(str(ARTIFACTS / f"{name}-desktop.png"))  # type: ignore[attr-defined]
    driver.set_window_size(*PHONE)  # type: ignore[attr-defined]
    try:
        assert_fits(driver, name)
        driver.save_screenshot(str(ARTIFACTS / f"{name}-phone.png"))  # type: ignore[attr-defined]
    finally:
        driver.set_window_size(*DESKTOP)  # type: ignore[attr-defined]


def assert_fits(driver: object, name: str) -> None:
    wide = driver.execute_script(  # type: ignore[attr-defined]
        "const w = document.documentElement.clientWidth;"
        "const out = [];"
        "for (const e of document.querySelectorAll('body *')) {"
        "  if (e.closest('.zoomed')) continue;"  # the zoomed page image scrolls in its box
        "  const r = e.getBoundingClientRect();"
        "  if (!r.width || r.right <= w + 1) continue;"
        # inside a 1-pixel clipped box (headers kept for screen readers): not on screen
        "  let p = e, clipped = false;"
        "  while (p && !clipped) { const s = getComputedStyle(p);"
        "    clipped = s.overflow === 'hidden' && p.getBoundingClientRect().width <= 1;"
        "    p = p.parentElement; }"
        "  if (!clipped) out.push(e.tagName + '.' + e.className + ' ' + Math.round(r.right));"
        "}"
        "return [document.documentElement.scrollWidth, w, out.slice(0, 5)];")
    assert wide[0] <= wide[1] and not wide[2], (name, wide)


def axe(driver: object, name: str) -> list[dict]:
    """axe-core's serious and critical violations on the page shown."""
    assert AXE.exists(), "axe-core is needed (scripts/test installs it into .test-npm/)"
    driver.execute_script(AXE.read_text())  # type: ignore[attr-defined]
    result = driver.execute_async_script(  # type: ignore[attr-defined]
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact,"
        " nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', nodes: [String(e)]}]));")
    bad = [v for v in result if v["impact"] in ("serious", "critical")]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"axe-{name}.json").write_text(json.dumps(result, indent=1))
    return bad


def check_page(driver: object, name: str, root: Path | None = None) -> None:
    """No serious or critical accessibility problem, desktop and phone screenshots."""
    assert axe(driver, name) == [], name
    shots(driver, name, root)


# -- 1. search ----------------------------------------------------------------------------

def test_search_finds_a_document_by_its_words(browser, site: Site) -> None:
    from selenium.webdriver.common.by import By

    browser.get(site.base + "/")
    box = browser.find_element(By.ID, "find-q")
    box.send_keys("TONER cartridge")
    box.submit()
    wait_for(lambda: "invoice.pdf" in text_of(browser, "#hits"), 10, "hit")
    hits = text_of(browser, "#hits")
    assert "page 2" in hits and "turned.pdf" not in hits
    marked = text_of(browser, "#hits mark").lower()
    assert "toner" in marked and "cartridge" in marked
    check_page(browser, "search", site.root)
    browser.find_element(By.CSS_SELECTOR, "#hits a").click()
    wait_for(lambda: "invoice.pdf" in text_of(browser, "#file-name"), 10, "review")
    assert browser.current_url.endswith("#page-2")
    assert "toner" in text_of(browser, "#page-2 .markdown mark").lower()
    assert text_of(browser, "#page-1 .markdown mark") == ""
    check_page(browser, "review-search-hit", site.root)
    # the same for scripts
    api = site.api("/api/search?q=toner")
    assert api["total"] == 1 and api["hits"][0]["page"] == 2
    assert api["hits"][0]["file"]["name"] == "invoice.pdf"
    assert "<mark>toner</mark>" in api["hits"][0]["snippet"]


# -- 2. every file by name --------------------------------------------------------------------

def test_a_file_not_ready_is_shown_by_name_with_why_and_until(browser, site: Site) -> None:
    browser.get(site.base + "/files?state=waiting")
    wait_for(lambda: "empty.pdf" in text_of(browser, "#waiting"), 20, "empty.pdf listed")
    row = text_of(browser, "#waiting")
    assert "empty — fails at" in row and "unless it changes" in row
    check_page(browser, "files-waiting", site.root)
    browser.get(site.base + "/")
    wait_for(lambda: "empty.pdf" in text_of(browser, "#live #waiting"), 10, "on the overview")
    status = site.api("/api/status")
    waiting = [w for w in status["waiting"] if w["name"] == "empty.pdf"]
    assert waiting and waiting[0]["reason"] == "empty" and waiting[0]["fails_then"]
    assert waiting[0]["until"] > time.time()
    out = subprocess.run([sys.executable, "-m", "ocrd", "status", "-c",
                          str(site.daemon.config_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "waiting     empty.pdf  empty — fails at" in out.stdout, out.stdout


# -- 3. review ------------------------------------------------------------------------------

def _dark_rows(jpeg: bytes) -> tuple[float, float]:
    """Mean darkness of the top and the bottom tenth of an image."""
    from PIL import Image, ImageStat

    img = Image.open(io.BytesIO(jpeg)).convert("L")
    h = img.height
    top = ImageStat.Stat(img.crop((0, 0, img.width, h // 10))).mean[0]
    bottom = ImageStat.Stat(img.crop((0, h - h // 10, img.width, h))).mean[0]
    return 255 - top, 255 - bottom


def test_review_shows_pages_upright_at_full_size_and_the_original_inline(
        browser, site: Site) -> None:
    from selenium.webdriver.common.by import By

    turned = site.file_id("turned")
    browser.get(f"{site.base}/files/{turned}")
    assert "turned 180° to be read" in text_of(browser, "#page-1 header")
    img = browser.find_element(By.CSS_SELECTOR, "#page-1 img.preview")
    wait_for(lambda: browser.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth > 0;", img), 60, "image")
    with urllib.request.urlopen(f"{site.base}/files/{turned}/pages/1.jpg", timeout=30) as r:
        top, bottom = _dark_rows(r.read())
    assert top > 3 * bottom, (top, bottom)  # the bar is at the top: shown as read
    check_page(browser, "review-turned", site.root)

    browser.find_element(By.LINK_TEXT, "full size, zoom").click()
    wait_for(lambda: "page 1 of 1" in text_of(browser, "h1"), 10, "page view")
    assert "turned it 180°" in text_of(browser, "#rotation-note")
    browser.find_element(By.LINK_TEXT, "200 %").click()
    full = browser.find_element(By.CSS_SELECTOR, "img.full")
    wait_for(lambda: browser.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth > 0;", full), 60, "full")
    assert browser.execute_script("return arguments[0].naturalHeight;", full) > 2000
    box = browser.find_element(By.CSS_SELECTOR, ".zoomed")
    assert browser.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth;",
                                  box)
    check_page(browser, "page-zoom", site.root)

    invoice = site.file_id("invoice")
    browser.get(f"{site.base}/files/{invoice}")
    links = text_of(browser, ".links")
    assert "open the original" in links and "searchable PDF" in links
    for kind in ("original", "pdf"):
        with urllib.request.urlopen(f"{site.base}/files/{invoice}/open/{kind}", timeout=10) as r:
            assert r.headers["content-type"] == "application/pdf"
            assert r.headers["content-disposition"].startswith("inline")
            policy = r.headers["content-security-policy"]
            assert "script-src 'none'" in policy and "form-action 'none'" in policy
            assert r.read(5) == b"%PDF-"


def test_a_file_being_converted_shows_page_k_of_n_and_its_original(browser,
                                                                   tmp_path: Path) -> None:
    """The simulated engine at one page at a time, a few seconds a page."""
    port = free_port()
    daemon = Daemon(tmp_path, web={"listen": f"127.0.0.1:{port}"}, engine={
        "kind": SIMULATED, "options": {"max_batch": 1, "step_seconds": 0.1,
                                           "decode_steps": 25, "decode_jitter": 0}},
        schedule={"pages_in_flight": 1})
    daemon.start()
    base = f"http://127.0.0.1:{port}"
    try:
        drop(make_pdf(tmp_path / "long.pdf", [sentence_lines(i) for i in range(8)]),
             daemon.inbox / "long.pdf")

        def midway() -> dict | None:
            with urllib.request.urlopen(base + "/api/status", timeout=10) as r:
                conv = json.loads(r.read())["converting"]
            return next((c for c in conv if c["pages_done"] >= 2), None)

        doc = wait_for(midway, 60, "two pages done")
        assert doc["pages"] == 8 and doc["name"] == "long.pdf" and doc["eta_seconds"] > 0
        browser.get(f"{base}/files/{doc['job_id']}")
        text = text_of(browser, "#progress")
        assert "Converting: page" in text and "of 8" in text and "left" in text
        assert "open the original" in text_of(browser, ".links")  # in the work area
        assert "original not kept" not in text_of(browser, ".links")
        browser.get(f"{base}/files?state=converting")
        assert "of 8" in text_of(browser, "#files .progress-text")
        shots(browser, "files-converting", tmp_path)
        browser.get(base + "/")
        assert "long.pdf" in text_of(browser, "#converting-files")
        shots(browser, "overview-converting", tmp_path)
    finally:
        daemon.stop()


def _rendered_width(driver: object, img: object) -> tuple[float, int]:
    """(width the page image takes on screen in CSS pixels, its own pixels)."""
    return tuple(driver.execute_script(  # type: ignore[attr-defined, return-value]
        "return [arguments[0].getBoundingClientRect().width, arguments[0].naturalWidth];",
        img))


def test_zoom_1_to_1_shows_the_image_s_own_pixels_not_the_window_s_width(
        browser, site: Site) -> None:
    """"fit the window" shrinks the page to the window; 1:1 gives each image pixel one
    CSS pixel (wider than the window here: it scrolls in its box); 200 % two."""
    from selenium.webdriver.common.by import By

    invoice = site.file_id("invoice")
    widths = {}
    for zoom in ("fit", "100", "200", "50"):
        browser.get(f"{site.base}/files/{invoice}/pages/1?zoom={zoom}")
        full = browser.find_element(By.CSS_SELECTOR, "img.full")
        wait_for(lambda f=full: browser.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0;", f), 60, zoom)
        widths[zoom] = _rendered_width(browser, full)
    box = browser.execute_script(
        "return document.querySelector('.zoomed').clientWidth;")
    natural = widths["100"][1]
    assert natural > box, (natural, box)  # an A4 page at 300 dpi: wider than the window
    assert widths["fit"][0] <= box + 1, widths
    assert abs(widths["100"][0] - natural) <= 1, widths
    assert abs(widths["200"][0] - 2 * natural) <= 2, widths
    assert abs(widths["50"][0] - natural / 2) <= 1, widths
    assert "1:1 (100 %)" in text_of(browser, "nav.zoom")


def test_turn_this_page_converts_the_file_again_with_the_page_read_that_way(
        browser, tmp_path: Path) -> None:
    """A page lying sideways, read as it lies (no orientation detection here): garbage.
    "Turn this page: 90° clockwise" (the console's CSRF-protected form) puts the file
    through again; the page is read turned, the Markdown says the words, the sidecar
    says who turned it, the new results replace the old, and the page shows upright."""
    from selenium.webdriver.common.by import By

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    lines = sentence_lines(71, 8)
    sideways = tmp_path / "sideways.png"
    text_image(lines, (2000, 1000)).rotate(90, expand=True).save(sideways)  # lies on its side
    root = tmp_path / "d"
    with Daemon(root, web={"listen": f"127.0.0.1:{port}"},
                engine={"kind": "tesseract", "tesseract": {"orientation": False}}) as d:
        d.start()
        drop(sideways, d.inbox / "sideways.png")
        wait_for((d.outbox / "sideways.md").exists, 120, "sideways.md")
        assert recall(lines, (d.outbox / "sideways.md").read_text()) < 0.3  # read as it lies
        def done_ids() -> list[int]:
            with urllib.request.urlopen(base + "/api/files?q=sideways&state=done",
                                        timeout=10) as r:
                return [f["id"] for f in json.loads(r.read())["files"]]

        (first,) = wait_for(done_ids, 30, "its row done")
        browser.get(f"{base}/files/{first}/pages/1")
        assert "Turn this page" in text_of(browser, "#turn")
        check_page(browser, "page-turn")
        browser.find_element(By.CSS_SELECTOR, "#turn button[value='90']").click()
        wait_for(lambda: "read turned 90°" in text_of(browser, "#flash"), 20, "the message")
        assert "converted again" in text_of(browser, "#flash")

        def again() -> bool:
            claims = [e for e in d.events("file_converted") if e["file"] == "sideways.png"]
            return len(claims) == 2
        wait_for(again, 120, "the second conversion")
        text = (d.outbox / "sideways.md").read_text()
        meta = json.loads((d.outbox / "sideways.json").read_text())
        assert recall(lines, text) >= 0.9, text
        assert meta["pages"][0]["rotation"] == 90 and meta["pages"][0]["turned_by"] == "hand"
        assert sorted(p.name for p in d.outbox.iterdir()) == ["sideways.json", "sideways.md"]
        assert [p.name for p in d.archive.iterdir()] == ["sideways.png"]
        newest = wait_for(lambda: len(ids := done_ids()) == 2 and max(ids), 30, "the new row")
        assert newest != first
        browser.get(f"{base}/files/{newest}/pages/1?zoom=100")
        assert "turned 90° by hand" in text_of(browser, "#rotation-note")
        full = browser.find_element(By.CSS_SELECTOR, "img.full")
        wait_for(lambda: browser.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0;", full), 60, "img")
        w, h = browser.execute_script(
            "return [arguments[0].naturalWidth, arguments[0].naturalHeight];", full)
        assert w > h, (w, h)  # shown upright: as wide as the text lines, not on its side
        # a form without the CSRF token is refused
        req = urllib.request.Request(f"{base}/files/{newest}/pages/1/turn",
                                     data=b"rotation=180", method="POST")
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("a turn without the CSRF token was taken")
        except urllib.error.HTTPError as e:
            assert e.code == 403
        assert len([e for e in d.events("file_claimed")
                    if e["file"] == "sideways.png"]) == 2


# -- 4. actions -----------------------------------------------------------------------------

def test_failures_offer_what_helps_and_messages_do_not_come_back(browser, site: Site) -> None:
    from selenium.webdriver.common.by import By

    browser.get(site.base + "/failed")
    row = text_of(browser, "#failed")
    assert "locked.pdf" in row and "encrypted" in row and "qpdf --decrypt" in row
    # a retry of an encrypted file fails again: the person must say the cause is gone
    box = browser.find_element(By.CSS_SELECTOR, "#failed input[name=cause_gone]")
    assert box.get_attribute("required") is not None
    button = browser.find_element(By.CSS_SELECTOR, "#failed button.retry")
    assert button.get_attribute("aria-label") == "Retry locked.pdf (after removing the cause)"
    check_page(browser, "failed", site.root)
    browser.find_element(By.CSS_SELECTOR, "button[aria-label='Dismiss locked.pdf']").click()
    wait_for(lambda: "dismissed" in text_of(browser, "#flash"), 10, "dismissed")
    assert "locked.pdf" not in text_of(browser, "#failed")
    assert "?" not in browser.current_url  # the message is not in the URL
    shots(browser, "failed-dismissed", site.root)
    browser.refresh()
    assert text_of(browser, "#flash") == ""  # a reload does not bring it back
    assert (site.daemon.failed / "locked.pdf").exists()


def test_upload_drops_a_file_into_the_chosen_inbox(browser, site: Site) -> None:
    from selenium.webdriver.common.by import By

    pdf = make_pdf(site.root / "from browser.pdf", [["Uploaded through the console today"]])
    browser.get(site.base + "/upload")
    check_page(browser, "upload", site.root)
    browser.find_element(By.ID, "upload-file").send_keys(str(pdf))
    browser.find_element(By.CSS_SELECTOR, "#upload button").click()
    wait_for(lambda: "Uploaded into" in text_of(browser, "#flash"), 20, "uploaded")
    wait_for(lambda: (site.daemon.outbox / "from browser.md").exists(), 120, "converted")
    assert not [p for p in site.inbox.iterdir() if p.name.startswith(".ocrd-upload")]


# -- 5. phones, keyboards, every page ------------------------------------------------------------

def test_every_page_fits_a_phone_and_passes_axe(browser, site: Site) -> None:
    invoice = site.file_id("invoice")
    for name, path in (("overview", "/"), ("files", "/files"), ("files-bogus-state",
                       "/files?state=bogus"), ("review", f"/files/{invoice}"),
                       ("api", "/api"), ("search-empty", "/search?q=zzzqqq"),
                       ("missing", "/files/999999"), ("login", "/login")):
        browser.get(site.base + path)
        check_page(browser, name, site.root)
    browser.get(site.base + "/files?state=bogus")
    assert "There is no state 'bogus'" in text_of(browser, "#filter-error")


def test_live_refresh_updates_in_place_without_moving_focus(browser, site: Site) -> None:
    browser.get(site.base + "/")
    link = browser.execute_script(
        "const a = document.querySelector('#live #inboxes a'); a.focus(); return a;")
    assert browser.execute_script("return document.activeElement === arguments[0];", link)
    def updated() -> str | None:
        return browser.execute_script("return document.querySelector('#live').dataset.updated;")

    first = wait_for(updated, 20, "a refresh")
    wait_for(lambda: updated() != first, 20, "another refresh")
    # the same element, still focused, still in the page
    assert browser.execute_script(
        "return document.activeElement === arguments[0] && document.contains(arguments[0]);",
        link)
    assert browser.execute_script(
        "return document.querySelector('#now').getAttribute('aria-live');") == "polite"


def test_a_missing_inbox_is_a_banner_on_every_page(browser, tmp_path: Path) -> None:
    port = free_port()
    daemon = Daemon(tmp_path, web={"listen": f"127.0.0.1:{port}"}, rescan_seconds=1)
    daemon.start()
    base = f"http://127.0.0.1:{port}"
    try:
        browser.get(base + "/files")
        assert text_of(browser, "#banners") == ""
        daemon.inbox.rename(tmp_path / "unmounted")

        def banner_on(path: str) -> bool:
            browser.get(base + path)
            return "is missing" in text_of(browser, "#banners")

        wait_for(lambda: banner_on("/files"), 20, "the banner")  # within the rescan
        for path in ("/failed", "/upload", "/search", "/"):
            assert banner_on(path), path
        shots(browser, "banner-missing-inbox", tmp_path)
    finally:
        daemon.stop()
