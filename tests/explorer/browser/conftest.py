"""The browser and the server the browser tests share: headless Chromium, and ``mksim explore`` as a user
starts it (its studies in a storage of its own).

Needs Debian's ``chromium`` and ``chromium-driver`` (CI installs them in ``.ci/run``) and selenium (the ``dev``
extra); without the browser or its driver the tests skip, saying why (in CI they fail instead). Both fixtures
are package-scoped (ended after the package's last test) and every browser module is in the ``browser`` xdist
group, so one pytest-xdist worker runs them all, one after another, with one browser and one
server: starting Chromium, the server and the first page (the page's scripts compiled) costs seconds of CPU
each time.
"""

from __future__ import annotations

import shutil

import pytest

from tests.explorer.browser import drive


@pytest.fixture(scope="package")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        drive.need("headless Chromium needs Debian's chromium and chromium-driver (apt-get install chromium "
                   "chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        drive.need("selenium is not installed (python -m pip install -c constraints.txt -e '.[dev]')")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_page_load_timeout(drive.WAIT_S)
    yield d
    d.quit()


@pytest.fixture(scope="package")
def server(browser, tmp_path_factory):
    """``mksim explore`` on a free port, as a user starts it (its studies in a storage of its own; its log in
    the artifacts as explore-browser.log)."""
    folder = tmp_path_factory.mktemp("explore")
    with drive.explore(drive.free_port(), folder / "explore-browser.log", storage=folder / "studies.db") as url:
        yield url
