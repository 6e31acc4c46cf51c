"""The dossier in a real browser (L4): Debian's headless Chromium parses the file, its sections
and plots are in the DOM, and a screenshot shows ink where the charts are.

The campaign here is the whole chain (audit, baseline, runs with a diverged one, compare, test
looks, pilot, export, verify), so the pilot's gate table and the reload check are rendered
from the files those commands really wrote. The browser tests skip only when /usr/bin/chromium
is absent (`.ci/run` installs it); the HTML checks run everywhere.
"""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from tunepilot.report.flow import write_report
from tunepilot.report.html import SECTIONS

torch = pytest.importorskip("torch")

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
PHASES = [
    "environment",
    "data",
    "inspect",
    "load",
    "update audit",
    "first step",
    "steady step",
    "accumulation",
    "overfit",
    "evaluation",
    "checkpoint",
    "resume",
    "export",
]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory):
    from test_report import build_campaign

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ws = build_campaign(tmp_path_factory.mktemp("dossier"), full=True)
    finally:
        torch.set_num_threads(before)
    path, data = write_report(ws)
    return ws, path, data


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is absent (Debian's chromium; .ci/run installs it)")
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    done = subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def decode_png(path: Path) -> np.ndarray:
    """The RGB pixels (height x width x 3) of an 8-bit, non-interlaced PNG: zlib and the five
    PNG filters, no imaging library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.uint8)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:]
        if kind == 0:
            row = line.copy()
        elif kind == 1:  # Sub: a running sum per channel
            row = np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64) % 256
            row = row.astype(np.uint8).reshape(stride)
        elif kind == 2:  # Up
            row = line + prev
        else:  # Average and Paeth depend on the pixel just decoded: byte by byte
            row = bytearray(line.tobytes())
            up = prev.tobytes()
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b, c = up[i], (up[i - bpp] if i >= bpp else 0)
                if kind == 3:
                    row[i] = (row[i] + (a + b) // 2) & 255
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                    row[i] = (row[i] + pred) & 255
            row = np.frombuffer(bytes(row), np.uint8)
        out[y] = row
        prev = out[y]
    return out.reshape(height, width, bpp)[:, :, :3]


def ink(pixels: np.ndarray) -> int:
    """Pixels darker than the page's white and light-grey background."""
    return int((pixels.min(axis=2) < 225).sum())


def screenshot(tmp_path: Path, page: Path, name: str, height: int) -> np.ndarray:
    """The page at 1280 CSS px wide, rendered at half scale so the whole dossier fits."""
    png = tmp_path / name
    chromium(
        tmp_path,
        "--force-device-scale-factor=0.5",
        f"--window-size=1280,{height}",
        f"--screenshot={png}",
        page.as_uri(),
    )
    return decode_png(png)


# ---------------------------------------------------------------------------------------------


def test_s5_l3_r2_pilot_gates_sizing_plan_and_reload_check_are_rendered(full) -> None:
    _, path, data = full
    html = path.read_text(encoding="utf-8")
    pilot = html.split('<section id="pilot">')[1].split("</section>")[0]
    assert [r["phase"] for r in data["pilot"]["rows"]] == PHASES
    for phase in PHASES:
        assert f'<span class="nowrap">{phase}</span>' in pilot, phase
    assert "rss peak (+phase)" in pilot  # the CPU counter as its own column
    assert "Sizing sheet" in pilot and "examples per update" in pilot
    # The pilot measures; without `tunepilot plan` the dossier says the package is missing.
    rental = pilot.split("<h3>Rental plan (")[1]
    assert "no per-card sheet or package yet" in rental and "tunepilot plan" in rental
    exports = html.split('<section id="exports">')[1].split("</section>")[0]
    assert "control-s0-1" in exports and "control replay" in exports
    assert data["exports"][0]["verification"]["verdict"] == "PASS"
    assert any("the pilot ran on CPU" in x["sentence"] for x in data["limits"])


def test_l4_headless_chromium_parses_every_section_and_plot(full, tmp_path: Path) -> None:
    _, path, data = full
    dom = chromium(tmp_path, "--dump-dom", path.as_uri()).stdout
    for sid, _ in SECTIONS:
        assert f'<section id="{sid}">' in dom, sid
    assert dom.count("</section>") == len(SECTIONS)
    assert len(re.findall(r'<svg class="chart line-chart"', dom)) == 3 + len(data["runs"])
    assert dom.count('<svg class="chart interval-chart"') == 1
    assert dom.count('<svg class="chart bar-chart"') == 1
    assert dom.count("<polyline") >= 2 * 4  # 4 completed runs: combined + own chart
    assert dom.count('class="end-diverged"') == 6
    gates = dom.split('<table class="gates">')[1].split("</table>")[0]
    assert gates.count("<tr class=") == len(PHASES)
    text = re.sub(r"<[^>]+>", " ", dom)
    assert "Keep the control" in text or "Adopt" in text  # the decision reads as text
    assert "&lt;b&gt;note&lt;/b&gt;" in dom  # still text after parsing, never a <b> element


def test_l4_screenshot_is_not_blank_and_the_charts_draw_ink(full, tmp_path: Path) -> None:
    """One screenshot of the top of the page (1280 x 4000 CSS px) must not be blank; then the
    whole page with and without its <svg> charts: the charts must add visible pixels."""
    _, path, _ = full
    pixels = screenshot(tmp_path, path, "top.png", 4000)
    assert pixels.shape == (2000, 640, 3)
    top = ink(pixels)
    assert top > 0.05 * pixels.shape[0] * pixels.shape[1], f"{top} inked pixels: blank page?"
    colours = {tuple(p) for p in pixels[::5, ::5].reshape(-1, 3)}
    assert len(colours) > 100, f"{len(colours)} distinct colours"

    html = path.read_text(encoding="utf-8")
    bare = tmp_path / "no-charts.html"
    bare.write_text(re.sub(r'<svg class="chart.*?</svg>', "", html, flags=re.S), encoding="utf-8")
    with_charts = screenshot(tmp_path, path, "page.png", 16000)
    without = screenshot(tmp_path, bare, "bare.png", 16000)
    drawn, plain = ink(with_charts), ink(without)
    assert drawn - plain > 8_000, f"charts added only {drawn - plain} pixels"


# ---------------------------------------------------------------------------------------------
# The dossier loads nothing (L4): hostile strings from every source it renders, a browser, and
# a listener on 127.0.0.1 that must hear no request.


class _Listener:
    """An HTTP server on 127.0.0.1 that records every path asked for (and answers 404)."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.paths: list[str] = []
        heard = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server hook's name)
                heard.append(self.path)
                self.send_error(404)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _hostile_dossier(folder: Path, model: Path, url: str) -> Path:
    """A campaign whose behaviour, labels, note and GPU catalog card name each carry an image,
    a link and raw HTML pointing at `url`, run through audit, plan and note as a user would."""
    import json

    import yaml

    from sizing_support import fake_dry_run
    from tunepilot.data.flow import audit_workspace
    from tunepilot.data.workspace import Workspace
    from tunepilot.experiments import flow as run_flow
    from tunepilot.pilot.plan import build_plan
    from tunepilot.sizing.catalog import default_catalog_path

    def payload(tag: str) -> str:
        return (f'![{tag}]({url}/{tag}-md.png) <img src="{url}/{tag}-html.png"> '
                f'[{tag}]({url}/{tag}-link) <{url}/{tag}-auto>')

    folder.mkdir(parents=True)
    labels = [f"refund {payload('label')}", "shipping"]
    (folder / "data.jsonl").write_text("".join(
        json.dumps({"id": f"e{i}", "text": f"ticket {i} about {('money', 'boxes')[i % 2]}",
                    "label": labels[i % 2]}) + "\n" for i in range(40)), encoding="utf-8")
    campaign = {
        "name": "hostile",
        "hypothesis": {"behaviour": f"route tickets {payload('behaviour')}",
                       "task": "classification"},
        "model": {"name_or_path": str(model),
                  "lora": {"r": 4, "target_modules": ["query", "value"],
                           "modules_to_save": ["classifier"]}},
        "data": {"file": "data.jsonl", "fields": {"label": "label"}, "max_length": 32},
    }  # fmt: skip
    (folder / "campaign.yaml").write_text(yaml.safe_dump(campaign), encoding="utf-8")
    ws = Workspace.open(folder / "campaign.yaml")
    audit_workspace(ws, as_json=True)
    run_flow.note(ws, f"# a heading\n{payload('note')}", None)
    catalog = yaml.safe_load(default_catalog_path().read_text(encoding="utf-8"))
    catalog["cards"][0]["name"] = f"T4 {payload('card')}"
    (folder / "gpus.yaml").write_text(yaml.safe_dump(catalog), encoding="utf-8")
    _, lines = build_plan(ws, gpu=None, catalog=folder / "gpus.yaml", pilot=None,
                          splits={"train": 28, "validation": 8, "test": 4},
                          runner=fake_dry_run)  # fmt: skip
    pilot = ws.pilots_dir / "p-20260101-000000"
    pilot.mkdir(parents=True)
    (pilot / "gates.json").write_text(json.dumps({"verdict": "PASS", "rows": []}))
    (pilot / "plan.md").write_text("# Sizing and rental plan\n\n" + "\n".join(lines))
    assert f"{url}/card-md.png" in (pilot / "plan.md").read_text()  # the card reached plan.md
    path, _ = write_report(ws)
    return path


def test_l4_the_dossier_loads_nothing_even_when_every_user_string_points_at_a_server(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    """The browser fetched 17 images a catalog card name put in plan.md. Markdown is rendered
    without images, links or raw HTML, user text is escaped, and a Content-Security-Policy
    allows only inline styles and data: pictures. A control page without them proves the
    browser here does fetch from the listener."""
    listener = _Listener()
    try:
        control = tmp_path / "control.html"
        control.write_text(f'<!DOCTYPE html><img src="{listener.url}/control.png">')
        chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", control.as_uri())
        assert listener.paths == ["/control.png"], listener.paths  # the harness hears a fetch
        listener.paths.clear()

        page = _hostile_dossier(tmp_path / "c", tiny_bert_dir, listener.url)
        dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", page.as_uri()).stdout
        assert listener.paths == [], listener.paths
    finally:
        listener.close()
    html = page.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    tags = re.findall(r"<(?:img|a|script|iframe|link)\b[^>]*>", dom)
    assert all('src="data:' in t or 'href="#' in t for t in tags), tags
    assert listener.url not in re.sub(r">[^<]*<", "><", dom)  # only ever inside text nodes
    for tag in ("behaviour", "label", "note", "card"):
        assert f"({listener.url}/{tag}-md.png)" in dom, tag  # shown as the text it is
