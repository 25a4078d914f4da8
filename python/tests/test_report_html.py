"""`mmq report`: the compile report as one HTML page, rendered by a real headless browser
(Debian's Chromium, which tools/test.sh installs): no console errors, the charts are in the DOM
after the page's script ran, and the screenshot shows the modality colours of the bars."""

import os
import shutil
import subprocess

import pytest

from conftest import fixture

VISION, TEXT = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("MMQ_REQUIRE_BROWSER") == "1":
            pytest.fail("MMQ_REQUIRE_BROWSER=1 but no chromium on PATH")
        pytest.skip("no chromium on PATH (tools/test.sh installs Debian's chromium)")
    return path


def browse(page, tmp_path, *args):
    """Runs headless Chromium on `page`; returns (stdout, stderr)."""
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
    ]
    out = subprocess.run(
        [chromium(), *flags, *args, page.as_uri()], capture_output=True, text=True, timeout=120
    )
    return out.stdout, out.stderr


def console_errors(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if "CONSOLE" in l and ("Uncaught" in l or "rror" in l)]


def test_the_html_report_renders_in_a_headless_browser(tmp_path, mmq_bin):
    report, page = tmp_path / "report.json", tmp_path / "report.html"
    subprocess.run(
        [mmq_bin, "compile", fixture("clip") / "model.onnx", "--target", "ort", "--quant", "int8",
         "--placement", "all", "--calib-random", "4", "-o", tmp_path / "m.onnx", "--report", report],
        check=True, capture_output=True,
    )
    subprocess.run([mmq_bin, "report", report, "-o", page], check=True)
    html = page.read_text()
    assert "http://" not in html and "https://" not in html, "the page fetches nothing"

    dom, stderr = browse(page, tmp_path, "--dump-dom")
    assert console_errors(stderr) == []
    assert 'data-charts="2"' in dom, dom[:400]
    bars = int(dom.split('data-bars="')[1].split('"')[0])
    assert bars > 50, bars
    for want in ["Per-layer SQNR", "Activation granularity", "Alignment", "logits_per_image", "int8"]:
        assert want in dom, want

    shot = tmp_path / "shot.png"
    browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,1400")
    from PIL import Image

    pixels = list(Image.open(shot).convert("RGB").get_flattened_data())
    near = lambda c: sum(1 for p in pixels if all(abs(p[i] - c[i]) < 12 for i in range(3)))
    assert near(VISION) > 200 and near(TEXT) > 200, (near(VISION), near(TEXT))


def test_the_harness_sees_console_errors(tmp_path):
    """The browser check can fail: a page whose script throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>undefinedFunction()</script></body></html>")
    _, stderr = browse(bad, tmp_path, "--dump-dom")
    assert console_errors(stderr), stderr[-2000:]


def test_report_refuses_what_is_not_a_compile_report(tmp_path, mmq_bin):
    bad = tmp_path / "x.json"
    bad.write_text('{"a": 1}')
    out = subprocess.run([mmq_bin, "report", bad, "-o", tmp_path / "x.html"], capture_output=True, text=True)
    assert out.returncode == 1 and "not a compile report" in out.stderr
    bad.write_text("{")
    out = subprocess.run([mmq_bin, "report", bad, "-o", tmp_path / "x.html"], capture_output=True, text=True)
    assert out.returncode == 1 and "not JSON" in out.stderr and "line 1" in out.stderr
    assert not (tmp_path / "x.html").exists()
