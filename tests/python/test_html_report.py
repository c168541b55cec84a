"""test_html_report.py: the HTML report rendered by headless Chromium (Debian's package):
the page loads from a file with no network, names with markup stay text, the charts and
the table are drawn, and the screenshot shows a page (not a blank or an error page)."""
import json
import shutil
import struct
import subprocess
import zlib

import pytest
import torch
from safetensors.torch import save_file

import numalign

from test_hostile_names import NAMES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(*args):
    if CHROMIUM is None:
        pytest.fail("chromium is missing: `make deps` installs it")
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--no-first-run", *args],
                          capture_output=True, text=True, timeout=120, check=True)


def _png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of a PNG, decoded here (8-bit, no interlace)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0 and color in (2, 6)
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


@pytest.fixture(scope="module")
def page(tmp_path_factory, cli):
    d = tmp_path_factory.mktemp("html")
    g = torch.Generator().manual_seed(0)
    truth = {n: torch.randn(256, dtype=torch.float64, generator=g) * 4 for n in NAMES}
    ref = {n: t.to(torch.bfloat16) for n, t in truth.items()}
    test = {n: (t * 1.01).to(torch.bfloat16) if i % 2 else t.to(torch.bfloat16)
            for i, (n, t) in enumerate(truth.items())}
    for role, tensors in (("truth", truth), ("ref", ref), ("test", test)):
        save_file(tensors, d / f"{role}.safetensors")
    out = d / "report.html"
    p = cli("judge", d / "test.safetensors", d / "ref.safetensors", d / "truth.safetensors",
            "--format", "html", "-o", out)
    assert p.returncode == 1, p.stderr
    assert "NOT ALIGNED" in p.stderr, "the verdict line still reaches the terminal"
    return out


def test_chromium_renders_the_page_with_names_as_text(page):
    dom = _chromium("--dump-dom", page.as_uri()).stdout
    assert dom.count("<svg") == 3, "ratio, ULP and magnitude charts"
    assert dom.count("<tr class=") == len(NAMES)
    # The markup in a tensor name is text in the rendered document, not an element.
    assert "&lt;script&gt;alert" in dom
    assert dom.count("<script>") == 1
    assert "NOT ALIGNED" in dom and "Not measured" not in dom


def test_sorting_works_in_the_browser(page, tmp_path):
    # A copy of the page that clicks the "ratio" header twice (descending, then ascending:
    # the opposite of the report's own worst-first order) and records the first row.
    html = page.read_text()
    probe = html.replace("</body>", "<script>var th = document.querySelectorAll('#tensors th')[4];"
                         "th.click(); th.click();"
                         "document.title = document.querySelector('#tensors tbody tr td:nth-child(5)')"
                         ".textContent;</script></body>")
    copy = tmp_path / "sorted.html"
    copy.write_text(probe)
    dom = _chromium("--dump-dom", copy.as_uri()).stdout
    title = dom.split("<title>")[1].split("</title>")[0]
    ratios = [t["ratio"] for t in json.loads(_judge_json(page))["tensors"] if t["ratio"] is not None]
    assert float(title) == pytest.approx(min(ratios), rel=1e-3)
    assert min(ratios) < max(ratios)


def _judge_json(page):
    d = page.parent
    r = numalign.judge(d / "test.safetensors", d / "ref.safetensors", d / "truth.safetensors")
    return r.to_json()


def test_screenshot_shows_a_drawn_page(page, tmp_path):
    shot = tmp_path / "shot.png"
    _chromium("--window-size=1000,1200", f"--screenshot={shot}", page.as_uri())
    width, height, channels, rows = _png_pixels(shot)
    assert (width, height) == (1000, 1200)
    pixels = [rows[y][x * channels:x * channels + 3] for y in range(0, height, 7)
              for x in range(0, width, 7)]
    white = sum(p == b"\xff\xff\xff" for p in pixels) / len(pixels)
    red = sum(p[0] > 150 and p[1] < 80 and p[2] < 80 for p in pixels)
    assert 0.5 < white < 0.995, "mostly page background, but something drawn"
    assert red > 0, "the red verdict heading and failing points"


def test_python_to_html_matches_the_cli_and_charts_the_magnitude(page):
    d = page.parent
    args = (d / "test.safetensors", d / "ref.safetensors", d / "truth.safetensors")
    with_profile = numalign.judge(*args, magnitude_profile=True).to_html()
    without = numalign.judge(*args).to_html()
    assert with_profile.count("<svg") == 3 and "Not measured" not in with_profile
    assert without.count("<svg") == 2 and "Not measured" in without
    assert with_profile.split("<h2>Ratio")[1] == page.read_text().split("<h2>Ratio")[1]
