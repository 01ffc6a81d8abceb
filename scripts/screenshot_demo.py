"""Screenshots of the demo while `make demo` runs: the landed table (overview, record_id_unique check), the lineage
from the topic to the daily aggregate, the aggregate's asset page, the Avro table and the CDC topic's upsert table
(its id_unique check), and the table's retention_headroom check.

Not a project dependency: run it from any Python with Playwright (`pip install playwright`), driving Debian's
Chromium (`apt-get install chromium`; Playwright's own browser download does not work on a closed network):

    python scripts/screenshot_demo.py [--url http://127.0.0.1:3000] [--out docs]
"""

import argparse
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import sync_playwright

# Chromium must not call home on a closed network (refused connections slow every page down).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
PAGES = {
    "demo-asset-overview.png": "/assets/rpc/pizzas",
    "demo-asset-checks.png": "/assets/rpc/pizzas?view=checks&checkDetail=record_id_unique",
    "demo-lineage.png": "/assets/rpc/sauce_daily?view=lineage&lineageScope=upstream&lineageDepth=3",
    "demo-downstream-asset.png": "/assets/rpc/sauce_daily",
    "demo-avro-asset.png": "/assets/rpc/pizzas_avro",
    "demo-upsert-asset.png": "/assets/rpc/store_status",
    "demo-upsert-checks.png": "/assets/rpc/store_status?view=checks&checkDetail=id_unique",
    "demo-retention-check.png": "/assets/rpc/pizzas?view=checks&checkDetail=retention_headroom",
}
SCROLL = {"demo-avro-asset.png": 900}  # pixels down the page: the Avro table's nested columns and run metadata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000", help="the Dagster webserver of `make demo`")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="directory for the PNG files")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium executable")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        for name, path in PAGES.items():
            page.goto(args.url + path)
            page.wait_for_timeout(4000)  # the UI loads its data over GraphQL after the page itself
            skip = page.get_by_role("button", name="Skip")  # Dagster's first-visit community dialog
            try:
                skip.click(timeout=3000)
                page.wait_for_timeout(500)
            except PlaywrightTimeoutError:
                pass  # not shown (any more)
            if name in SCROLL:
                page.mouse.move(600, 600)  # over the scrolling pane
                page.mouse.wheel(0, SCROLL[name])
                page.wait_for_timeout(1000)
            page.screenshot(path=args.out / name)
            print(f"wrote {args.out / name}")
        browser.close()


if __name__ == "__main__":
    main()
