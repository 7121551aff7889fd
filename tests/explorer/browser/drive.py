"""How the browser tests drive the explorer: start ``mksim explore`` as a user does, wait for what a page
shows, read its text, charts and tables, and use its dropdowns, boxes and links as a user does.

Each read of the page is one WebDriver call (a table is read by one script, not a call per cell): every
call is a round trip to Chromium, and a page of 1,400 cells read cell by cell took 20 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clirun import as_from_a_terminal

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(os.environ.get("MKSIM_TEST_ARTIFACTS") or ROOT / "tests" / "explorer" / "artifacts")
DOCS_IMG = ROOT / "docs" / "img"
MODES = ["stream", "graph", "graph_pdl", "persistent_barrier", "megakernel"]
WAIT_S = 90  # a comparison takes about a second; a loaded CI machine may be slower


def need(what: str) -> None:
    """Skip, saying what is missing; in CI (which installs it) fail instead."""
    if os.environ.get("CI"):  # CI installs them: a missing browser there is a broken set-up, not a skip
        pytest.fail(f"{what}; .ci/run installs chromium and chromium-driver")
    pytest.skip(what)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def explore(port: int, log: Path, stop: int = signal.SIGTERM, storage: Path | None = None) -> Iterator[str]:
    """``mksim explore --port PORT`` (with ``--storage STORAGE``) as a user starts it, until it answers;
    stopped with ``stop`` on exit (SIGINT: Ctrl-C) sent to its process group, as a terminal does; its log goes
    to the artifacts."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    more = ["--storage", str(storage)] if storage else []
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mksim", "explore", "--port", str(port), *more], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=as_from_a_terminal)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(url + "/", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mksim explore did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, stop)  # to its process group, as a terminal's Ctrl-C
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / log.name)


def shot(driver: Any, name: str, element: Any = None, docs: bool = True) -> None:
    """A screenshot of the page's top, or of ``element``, into the artifacts (and, for ``docs`` ones,
    to docs/img/explorer-<name>.png with MKSIM_DOCS_SCREENSHOTS=1)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"explorer-{name}.png"
    driver.execute_script("window.scrollTo(0, 0)")
    if element is None:
        driver.save_screenshot(str(path))
    else:  # an element is shot within the window: make the window tall enough for all of it
        size = driver.get_window_size()
        bottom = element.rect["y"] + element.rect["height"]
        driver.set_window_size(size["width"], max(size["height"], int(bottom) + 200))
        element.screenshot(str(path))
        driver.set_window_size(size["width"], size["height"])
    if docs and os.environ.get("MKSIM_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(exist_ok=True)
        shutil.copy(path, DOCS_IMG / path.name)


def wait(driver: Any, cond: Callable[[Any], Any], what: str) -> Any:
    """What ``cond(driver)`` returns once it is true (polled every 0.1 s); fails after WAIT_S, with a screenshot."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    # Dash re-renders an element between finding it and reading it: a stale element is not yet the answer
    waiting = WebDriverWait(driver, WAIT_S, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,))
    try:
        return waiting.until(lambda d: cond(d))
    except TimeoutException:
        shot(driver, "failure", docs=False)
        pytest.fail(f"timed out waiting for {what}")


def text(driver: Any, element_id: str) -> str:
    """The text an element shows (``""`` when there is no such element yet)."""
    return driver.execute_script("const e = document.getElementById(arguments[0]); return e ? e.innerText : '';",
                                 element_id)


def figure(driver: Any, graph_id: str) -> list | None:
    """The plotted traces of a dcc.Graph, read from the page: ``[[name, x, y], ...]``."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0] + ' .js-plotly-plot');"
        "return e && e.data ? e.data.map(t => [t.name || null, t.x || null, t.y || null]) : null;", f"#{graph_id}")


def rows(driver: Any, css: str, key: str = "data-mode") -> dict[str, list[str]]:
    """The table rows ``css`` selects: ``{row's key attribute: [the text of each td]}``."""
    return dict(driver.execute_script(  # pairs, not an object: WebDriver's JSON would sort its keys
        "return [...document.querySelectorAll(arguments[0])].map(r => [r.getAttribute(arguments[1]), "
        "[...r.querySelectorAll('td')].map(c => c.innerText)]);", css, key))


def pick(driver: Any, dropdown_id: str, value: str) -> None:
    """Choose ``value`` in a dcc.Dropdown as a user does: open it, click the option."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, dropdown_id).click()
    option = wait(driver, lambda d: next((o for o in d.find_elements(By.CSS_SELECTOR, "[role=option]")
                                          if o.text.strip() == value), None), f"option {value} of {dropdown_id}")
    option.click()
    wait(driver, lambda d: text(d, dropdown_id).strip() == value, f"{dropdown_id} to show {value}")


def type_in(driver: Any, input_id: str, new: str) -> None:
    """Replace what a box holds with ``new``, typed."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, input_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE, new)


def click(driver: Any, element_id: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, element_id).click()


def upload(driver: Any, upload_id: str, path: Path) -> None:
    """Choose ``path`` in a dcc.Upload's file box, as a user does."""
    from selenium.webdriver.common.by import By

    box = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f"#{upload_id} input[type=file]"),
               f"the file box of {upload_id}")  # the page's scripts draw it: on a loaded machine, later
    box[0].send_keys(str(path))


def nav(driver: Any, name: str) -> None:
    """Follow the navigation bar's link to a page (the bar is drawn by the page's scripts: wait for it)."""
    from selenium.webdriver.common.by import By

    wait(driver, lambda d: d.find_elements(By.LINK_TEXT, name), f"the link to {name}")[0].click()


def open_page(driver: Any, url: str, name: str) -> None:
    """Open page ``name`` from the navigation bar, as a user does: from the page the browser shows if it is one of
    the explorer's at ``url``, else from the explorer's not-found page (loaded: the cheapest page to load, no
    chart, no comparison)."""
    if not driver.current_url.startswith(url + "/"):
        driver.get(url + "/no-such-page")
    nav(driver, name)


def search_page(driver: Any, url: str, fresh: bool = True) -> None:
    """Open the Search page (loaded; unless not ``fresh`` and the browser shows it already) and wait until its
    form is drawn."""
    from selenium.webdriver.common.by import By

    if fresh or driver.current_url.split("?")[0] != url + "/search":
        driver.get(url + "/search")
    wait(driver, lambda d: d.find_elements(By.ID, "search-start"), "the search page")
