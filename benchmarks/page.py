"""The browser page of `flink-memory serve`, in Debian's Chromium (Playwright): how long the page takes to load
an agent of 100 000 units (the page, its files, the agents, the global and its first level), against a
baseline run in the same script: the same page's files plus the whole tree as `GET .../memory?tree=true` gives it
(what a page that loads eagerly would wait for, units left out). And the screenshots of docs/service.md: the
tree, the history and recall of agent-0 on a store like the sample's (tests/pagekit.py).

    python benchmarks/page.py [--units 100000] [--runs 5] [--screenshots docs/images]   # --runs 0: screenshots only
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import uvicorn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # (pagekit: the stores; stagekit: the stages in memory)

from pagekit import large_store, sample_store  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from flink_memory.embeddings.static import StaticE5  # noqa: E402
from flink_memory.service.server import ServeOptions, build_service, http_app, uvicorn_config  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
EAGER = """async (agent) => {
  const started = performance.now();
  const answer = await fetch('/v1/agents/' + agent + '/memory?tree=true');
  const tree = (await answer.json()).tree;
  return [performance.now() - started, tree.length];
}"""


@contextmanager
def serving(store: str, embedder=None):
    service, keyring = build_service(ServeOptions(store=store), embedder)
    server = uvicorn.Server(uvicorn_config(http_app(service, keyring, "127.0.0.1"), "127.0.0.1", 0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def load_times(browser, url: str, agent: str, runs: int) -> tuple[list[float], list[float], int]:
    """(lazy page loads, eager baseline loads, nodes in the eager tree), seconds."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    lazy, eager, nodes = [], [], 0
    for _ in range(runs):
        started = time.perf_counter()
        page.goto(f"{url}/ui/#agent={agent}")
        page.wait_for_selector("#tree[data-ready] li.node[data-depth='1']")
        lazy.append(time.perf_counter() - started)
        started = time.perf_counter()
        page.goto(f"{url}/ui/#agent=none")  # (the page's files again, then the whole tree at once)
        page.wait_for_selector("#error:not([hidden])")
        _, nodes = page.evaluate(EAGER, agent)
        eager.append(time.perf_counter() - started)
    page.close()
    return lazy, eager, nodes


def screenshots(browser, url: str, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 820})
    page.goto(f"{url}/ui/#agent=agent-0&view=tree")
    page.wait_for_selector("#tree[data-ready]")
    for kind in ("merge", "batch"):
        page.click(f"#tree li.node[data-kind='{kind}'] > .row .toggle")
        page.wait_for_selector(f"#tree li.node[data-kind='{kind}'] > ul.children > li.node")
    page.evaluate("window.scrollTo(0, 0)")
    shots = [folder / "page-tree.png"]
    page.screenshot(path=str(shots[-1]))
    page.click("#tabs button[data-view='history']")
    page.wait_for_selector("#history tbody tr .badge.remade")
    page.evaluate("document.querySelector('#history .badge.remade').scrollIntoView({block: 'center'})")
    shots.append(folder / "page-history.png")
    page.screenshot(path=str(shots[-1]))
    page.click("#tabs button[data-view='recall']")
    page.fill("#question", "Which city is Chen Wei based in?")
    page.click("#recall-form button[type='submit']")
    page.wait_for_selector("#hits[data-ready]")
    shots.append(folder / "page-recall.png")
    page.screenshot(path=str(shots[-1]))
    page.close()
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--screenshots", type=Path, help="write the three views' PNG files here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        if args.runs:  # (--runs 0: the screenshots only)
            started = time.perf_counter()
            large = large_store(str(Path(tmp) / "large.sqlite"), units=args.units)
            print(f"store of one agent of {args.units} units written in {time.perf_counter() - started:.1f} s")
            with serving(large) as url:
                lazy, eager, nodes = load_times(browser, url, "big", args.runs)
            lazy_ms, eager_ms = statistics.median(lazy) * 1000, statistics.median(eager) * 1000
            runs = ", ".join(f"{t * 1000:.0f}" for t in lazy)
            print(f"page load, level by level : median {lazy_ms:.0f} ms (runs: {runs})")
            print(f"baseline, the whole tree  : median {eager_ms:.0f} ms ({nodes} nodes, units left out)")
            print(f"ratio page / baseline     : {lazy_ms / eager_ms:.2f}")
        if args.screenshots:
            with serving(sample_store(Path(tmp) / "sample"), StaticE5()) as url:
                for shot in screenshots(browser, url, args.screenshots):
                    print(f"screenshot: {shot}")
        browser.close()


if __name__ == "__main__":
    main()
