"""The browser page of `flink-memory serve`, in a real browser: Debian's Chromium (/usr/bin/chromium) driven by
Playwright, on a store like the sample's (tests/pagekit.py). The page shows what the API shows, to the key the
API would show it to: the tree as `flink-memory show --tree` prints it, recall's hits in the API's order, nothing
of an agent the key does not grant (in the page and in every request it makes), a clear refusal without a valid
key, and an agent of 100 000 units loaded level by level."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from pagekit import large_store, sample_store
from servicekit import call, serving

from flink_memory.cli.display import snippet
from flink_memory.embeddings.static import StaticE5
from flink_memory.service.keys import add_key
from flink_memory.service.page import CSP
from flink_memory.service.server import ServeOptions
from flink_memory.store import open_store

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The sample's store and a store of one agent of 100 000 units, served with keys."""
    root = tmp_path_factory.mktemp("page")
    sample = sample_store(root / "sample")
    large_store(str(root / "large.sqlite"))
    keys = str(root / "keys.json")
    key0, _ = add_key(keys, ["agent-0"])
    key1, _ = add_key(keys, ["agent-1"])
    big, _ = add_key(keys, ["big"])
    with serving(ServeOptions(store=sample, keys=keys), embedder=StaticE5()) as url, \
            serving(ServeOptions(store=str(root / "large.sqlite"), keys=keys)) as large_url:
        yield {"url": url, "store": sample, "key0": key0, "key1": key1, "large": large_url, "big": big}


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module (Playwright launches it with a fresh profile directory)."""
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    yield tab
    context.close()


def enter_key(page, url: str, key: str | None) -> None:
    page.goto(f"{url}/ui/")
    if key is not None:
        page.fill("#key", key)
        page.click("#use-key")


def open_all(page, kinds=("global", "merge")) -> None:
    """Open every node of these kinds, level by level, until none is closed."""
    while True:
        closed = [li for li in page.query_selector_all("#tree li.node")
                  if li.get_attribute("data-kind") in kinds
                  and li.query_selector(":scope > .row .toggle[aria-expanded='false']")]
        if not closed:
            return
        for li in closed:
            li.query_selector(":scope > .row .toggle").click()
            li.wait_for_selector(":scope > ul.children > li", state="attached")


def test_no_key_or_a_wrong_key_is_refused_clearly(page, served):
    answers = []
    page.on("response", lambda r: answers.append(r))
    enter_key(page, served["url"], None)
    refusal = page.wait_for_selector("#refusal:not([hidden])")
    assert "Refused: this service needs a key (401)" in refusal.inner_text()
    assert page.is_hidden("#app") and page.query_selector_all("#tree li") == []
    page.fill("#key", "fmk_00000000_not-a-key")
    page.click("#use-key")
    page.wait_for_selector("#refusal:has-text('does not accept this key')")  # (no wait_for_function: CSP forbids eval)
    assert page.is_hidden("#app")
    # the page and its files carry the policy; the key went in a header, never in a URL
    files = {a.url.rsplit("/", 1)[-1]: a.headers for a in answers if "/ui/" in a.url}
    assert set(files) >= {"", "app.js", "app.css"}
    assert all(headers["content-security-policy"] == CSP for headers in files.values())
    assert "'unsafe-inline'" not in CSP and "default-src 'self'" in CSP
    assert not any("fmk_" in a.url for a in answers)
    assert page.evaluate("localStorage.length") == 0


def test_the_tree_of_agent_0_is_what_show_tree_prints(page, served):
    enter_key(page, served["url"], served["key0"])
    page.wait_for_selector("#tree[data-ready]")
    open_all(page)
    shown = []
    for li in page.query_selector_all("#tree li.node"):
        if li.get_attribute("data-kind") == "unit":
            continue
        depth = int(li.get_attribute("data-depth"))
        desc = li.query_selector(":scope > .row .desc").inner_text()
        missing = li.query_selector(":scope > .row .missing")
        note = f" {missing.inner_text()}" if missing else ""
        text = li.query_selector(":scope > .text").text_content()
        shown.append(f"{'  ' * depth}{desc}{note}: {snippet(text, 100)}")
    printed = subprocess.run([sys.executable, "-m", "flink_memory.cli", "show", "agent-0", "--store", served["store"],
                              "--tree"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(printed) > 5 and shown == printed
    # a batch node opens onto its memory units, in the order of its children
    batch = page.query_selector("#tree li.node[data-kind='batch']")
    batch.query_selector(":scope > .row .toggle").click()
    batch.wait_for_selector(":scope > ul.children > li.node")
    units = [li.get_attribute("data-id") for li in batch.query_selector_all(":scope > ul.children > li.node")]
    with open_store(served["store"]) as store:
        node = store.node("agent-0", batch.get_attribute("data-id"))
        texts = {u.unit_id: u.text for u, _ in store.units("agent-0")}
    assert units == node.children
    assert batch.query_selector(":scope > ul.children > li.node > .text").text_content() == texts[units[0]]


def test_a_recall_on_the_page_gives_the_apis_hits_in_the_apis_order(page, served):
    enter_key(page, served["url"], served["key0"])
    page.wait_for_selector("#tree[data-ready]")
    page.click("#tabs button[data-view='recall']")
    question = "Which city is Chen Wei based in?"
    page.fill("#question", question)
    page.fill("#k", "8")
    page.click("#recall-form button[type='submit']")
    page.wait_for_selector("#hits[data-ready]")
    shown = [(li.get_attribute("data-id"), float(li.query_selector(".score").inner_text().removeprefix("score ")))
             for li in page.query_selector_all("#hits li.hit")]
    status, answer = call(f"{served['url']}/v1/agents/agent-0/recall", "POST",
                          {"question": question, "k": 8, "mode": "hybrid", "explain": True}, key=served["key0"])
    assert status == 200 and len(answer["hits"]) >= 3
    assert shown == [(h["node_id"], h["score"]) for h in answer["hits"]]
    first = page.query_selector("#hits li.hit")
    parts = answer["hits"][0]["parts"]
    assert f"specificity {parts['specificity']:.4g}" in first.query_selector(".parts").inner_text()
    assert parts["cosine"] is not None and parts["keyword"] is not None  # hybrid: both parts of the ranking
    # where a hit sits in the tree: its path, and a click opens the tree down to it
    unit = next(h for h in answer["hits"] if h["kind"] == "unit")
    path = answer["paths"][unit["node_id"]]
    assert path[0].startswith("global-") and path[-1] == unit["covered_by"]
    page.click(f"#hits li.hit[data-id='{unit['node_id']}'] button.path")
    found = page.wait_for_selector("#tree li.node.found")
    assert found.get_attribute("data-id") == unit["node_id"] and int(found.get_attribute("data-depth")) == len(path)


def test_history_marks_what_changed(page, served):
    enter_key(page, served["url"], served["key0"])
    page.wait_for_selector("#tree[data-ready]")
    page.click("#tabs button[data-view='history']")
    page.wait_for_selector("#history tbody tr")
    rows = page.query_selector_all("#history tbody tr")
    remade = [r.get_attribute("data-id") for r in rows if r.query_selector(".badge.remade")]
    status, answer = call(f"{served['url']}/v1/agents/agent-0/history?limit=100", key=served["key0"])
    assert remade and remade == [e["node_id"] for e in answer["events"] if "remade" in e["marks"]]
    assert len(rows) == len(answer["events"]) == answer["total"] > 40
    with open_store(served["store"]) as store:  # the update's new text is there, the deleted unit is not
        assert any("Chen Wei moved to Vancouver" in u.text for u, _ in store.units("agent-0"))
    ids = [r.get_attribute("data-id") for r in rows]
    assert "a0-m001" in ids and "a0-m002" not in ids


def other_agents_texts(store_url: str) -> list[str]:
    """The units of agents 1-3 that agent-0's memory does not hold too (the sample repeats a few facts)."""
    with open_store(store_url) as store:
        mine = "\n".join([u.text for u, _ in store.units("agent-0")] + [n.text for n in store.nodes("agent-0")])
        return [u.text for a in ("agent-1", "agent-2", "agent-3") for u, _ in store.units(a) if u.text not in mine]


def test_a_key_for_one_agent_sees_nothing_of_another(page, served):
    sent, bodies = [], []
    page.on("request", lambda r: sent.append((r.url, r.headers.get("authorization"))))
    page.on("response", lambda r: bodies.append(r.text()) if "/v1/" in r.url else None)
    enter_key(page, served["url"], served["key0"])
    page.wait_for_selector("#tree[data-ready]")
    assert [a.inner_text() for a in page.query_selector_all("#agents a")] == ["agent-0"]
    open_all(page)
    page.click("#tabs button[data-view='history']")
    page.wait_for_selector("#history tbody tr")
    page.click("#tabs button[data-view='recall']")
    page.fill("#question", "Who approved the invoice for the vendor contract?")
    page.click("#recall-form button[type='submit']")
    page.wait_for_selector("#hits[data-ready]")
    page.evaluate("location.hash = 'agent=agent-1&view=tree'")  # another agent, named in the address
    page.wait_for_selector("#error:has-text('agent-1')")
    assert page.query_selector_all("#tree li") == []
    page.wait_for_load_state("networkidle")
    shown = page.inner_text("body")
    foreign = other_agents_texts(served["store"])
    assert len(foreign) > 100
    assert not any(text in shown for text in foreign)
    api = [(url, auth) for url, auth in sent if "/v1/" in url]
    assert len(api) > 5 and not any(f"agent-{n}" in url for url, _ in api for n in (1, 2, 3))
    assert all(auth in (None, f"Bearer {served['key0']}") for _, auth in api)  # (None: before the key was given)
    assert sum(auth is not None for _, auth in api) > 5
    assert not any(served["key0"] in url for url, _ in sent)
    assert not any(text in body for body in bodies for text in foreign)
    # the key stays in this tab: not in localStorage, and a new tab (context) starts without it
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("sessionStorage.getItem('flink-memory-key')") == served["key0"]
    # and agent-1's own key reads agent-1 only
    page.fill("#key", served["key1"])
    page.click("#use-key")
    page.wait_for_selector("#agents a[data-agent='agent-1']")
    assert [a.inner_text() for a in page.query_selector_all("#agents a")] == ["agent-1"]


def test_an_agent_of_100000_units_loads_level_by_level_in_under_a_second(page, served, capsys):
    sent = []
    page.on("request", lambda r: sent.append(r.url))
    enter_key(page, served["large"], served["big"])
    page.wait_for_selector("#tree[data-ready]")
    timings = []
    for _ in range(3):  # a reload with the key in the tab: the page, its files, the agents and the first level
        del sent[:]
        started = time.perf_counter()
        page.reload()
        page.wait_for_selector("#tree[data-ready] li.node[data-depth='1']")
        timings.append(time.perf_counter() - started)
    loaded = min(timings)
    level1 = page.query_selector_all("#tree li.node[data-depth='1']")
    assert page.query_selector("#tree li.node[data-depth='0']").get_attribute("data-id") == "global-1"
    assert len(level1) == 4 and page.query_selector_all("#tree li.node[data-kind='unit']") == []
    assert not any("/children" in url and "global-1" not in url for url in sent)  # one level, nothing below
    with capsys.disabled():
        print(f"\npage load, agent of 100 000 units: {loaded * 1000:.0f} ms (best of 3; "
              f"all: {', '.join(f'{t * 1000:.0f}' for t in timings)} ms; {len(sent)} requests)")
    assert loaded < 1.0
    status, facts = call(f"{served['large']}/v1/agents/big/store", key=served["big"])
    assert status == 200 and facts["rows"] == 100_000 + 2_000 + 250 + 32 + 4 + 1
    assert json.loads(json.dumps(facts))["rows_with_vectors"] == 0
