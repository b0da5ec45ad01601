"""The catalogue and the navigation at 375 px (issue 28): no column and no link off-screen,
nothing to scroll sideways to find. Screenshots go to var/screenshots/ (conftest.shot)."""
from __future__ import annotations

from tests.frontend.conftest import horizontal_overflow, shot, sign_in

OFF_SCREEN = """(sel) => {
    const w = document.documentElement.clientWidth;
    return [...document.querySelectorAll(sel)]
        .filter(el => getComputedStyle(el).display !== 'none')
        .map(el => [el.textContent.trim().slice(0, 30) || el.tagName, el.getBoundingClientRect()])
        .filter(([, r]) => r.width > 0 && (r.right > w + 1 || r.left < -1))
        .map(([t, r]) => t + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
}"""


def test_the_catalogue_and_the_nav_fit_375_px(phone, page, live_server, alice, catalog):
    for p in (phone, page):
        sign_in(p, alice.user, live_server.url)
        p.goto("/console/catalogue/?never=1")  # every offer (no hosts here: all "never")
        p.wait_for_selector("#catalogue tbody tr")
    shot(page, "catalogue-1280")
    shot(phone, "catalogue-375")
    assert phone.evaluate("document.documentElement.clientWidth") == 375
    assert horizontal_overflow(phone) == []
    # every cell of every row on screen: a phone shows each offer whole, labelled, without a sideways scroll
    assert phone.evaluate(OFF_SCREEN, "#catalogue th, #catalogue td") == []
    first = phone.locator("#catalogue tbody tr").first
    for label in ("Region", "vCPUs", "Free now"):  # each value labelled (td::before shows data-label)
        assert first.locator(f'td[data-label="{label}"]').is_visible()
    assert phone.evaluate("""() => getComputedStyle(document.querySelector('#catalogue td[data-label="Region"]'),
                                                    '::before').content""") == '"Region"'
    # every navigation link on screen at once, none hidden in a strip to scroll
    assert phone.evaluate(OFF_SCREEN, "nav.main a") == []
    assert phone.locator("nav.main a").count() >= 6
    # the desktop keeps its table: one row per offer, the headers in one row
    assert page.evaluate(OFF_SCREEN, "#catalogue th, #catalogue td, nav.main a") == []
    assert page.locator("#catalogue thead th").first.is_visible()
