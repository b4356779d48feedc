"""The capacity report as a person sees it: rendered by headless Chromium (Debian's `chromium`, installed
by scripts/install_chromium.sh from `make test`), the page must have every section, no text past the
viewport's edge or clipped by its box, every plot panel drawn (inked), plots not shrunk below readable,
and the first screen must show model, trace, the GPUs per pool, cost and how sure the plan is.
Screenshots go to .work/report-screenshots/ for a look."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from capacity_fixture import report

from llmcap.report.capacity import Provenance, Sources, render_html
from llmcap.report.capacity_sections import SECTIONS
from llmcap.sizing.ledger import Ledger
from tests.conftest import ROOT

SHOTS = ROOT / ".work" / "report-screenshots"
WIDTH = 1280

# Runs in the page after load; writes what it finds wrong into <pre id="layout-check"> for --dump-dom.
CHECK = """<script>
window.addEventListener('load', () => {
  const problems = [], vw = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > vw + 1) problems.push(`page wider than the viewport: ${document.documentElement.scrollWidth} > ${vw}`);
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
    const what = `${el.tagName} ${(el.id || el.textContent).slice(0, 60)}`;
    if (r.width > 0 && r.right > vw + 1) problems.push(`past the right edge (${Math.round(r.right)} > ${vw}): ${what}`);
    if (cs.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 1) problems.push(`clipped text: ${what}`);
  }
  for (const fig of document.querySelectorAll('figure')) {
    const img = fig.querySelector('img'), n = +fig.dataset.panels;
    if (!img.complete || img.naturalWidth === 0) { problems.push(`image not drawn: ${img.alt}`); continue; }
    if (img.width < 0.75 * img.naturalWidth) problems.push(`image shrunk to ${img.width}/${img.naturalWidth} px: ${img.alt}`);
    const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
    const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    for (let p = 0; p < n; p++) {
      const x0 = Math.floor(p * c.width / n), x1 = Math.floor((p + 1) * c.width / n);
      let ink = 0;
      for (let y = 0; y < c.height; y++) for (let x = x0; x < x1; x++) {
        const k = 4 * (y * c.width + x); if (d[k] + d[k + 1] + d[k + 2] < 600) ink++;
      }
      const share = ink / ((x1 - x0) * c.height);
      fig.dataset['ink' + p] = share.toFixed(4);
      if (share < MIN_INK) problems.push(`empty panel ${p + 1}/${n} of ${img.alt}: ${(100 * share).toFixed(2)}% inked`);
    }
  }
  const first = [...document.querySelectorAll('h1, #provenance, #answer')].filter(e => e.getBoundingClientRect().top < window.innerHeight);
  const pre = document.createElement('pre'); pre.id = 'layout-check';
  pre.textContent = JSON.stringify({problems, first_screen: first.map(e => e.innerText).join('\\n')});
  document.body.appendChild(pre);
});
</script>"""
MIN_INK = 0.012  # a matplotlib "no data" panel inks ~0.3%; the thinnest real panel here (KV usage lines) ~2.3%


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: run scripts/install_chromium.sh (make test does)")
    return exe


def _render(page: Path, tmp: Path, *args: str) -> str:
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp / 'profile'}",
        "--virtual-time-budget=5000",
        *args,
        page.as_uri(),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _long_named(rep):
    """The fixture's report with real-length configuration keys, pruned notes, a ledger and a header."""
    names = {k: f"H100-SXM-80GB/fp8/kv-fp8/tp{k[-1]}pp1ep1/seqs256/mbt8192/blk16" for k in rep.curves}
    table = rep.table
    widest = {
        "candidate": [names[c] for c in table.column("candidate").to_pylist()],
        "binding_slo": "prefill: TTFT; decode: ITL/TPOT",
        "ttft_p90_ms": 2716.0,
        "ttft_p99_ms": 15675.0,
        "itl_p90_ms": 29.91,
        "itl_p99_ms": 36.69,
        "e2e_p99_ms": 30827.0,
        "tokens_per_s": 4748.0,
        "mean_waiting": 0.001946,
        "kv_usage_p99": 0.8525,
        "preemptions": 0.0,
        "network_payload_mb": 1882.0,
        "visible_wait_ms_p99": 79.36,
    }
    for col, v in widest.items():  # values as wide as a real plan's (the fixture's evaluate reports no latencies)
        values = v if isinstance(v, list) else [v] * table.num_rows
        table = table.set_column(table.schema.get_field_index(col), col, pa.array(values, table.schema.field(col).type))
    pruned = tuple(
        f"not simulated H200-SXM-141GB/bf16/kv-bf16/tp{t}pp1ep1/seqs256/mbt2048/blk16 (bound 0.5 req/s per GPU): max_simulated 8 reached"
        for t in (2, 4, 8)
    )
    ledger = Ledger(20.0, 4.4, 0.8, 0.9, 0.0, False, rep.plan.total_gpus, 1, rep.plan.pools[0].pool.gpus_per_instance)
    prov = Provenance(
        "Llama-3.1-70B",
        "data/raw/azure2023/AzureLLMInferenceTrace_conv.csv",
        "5f" * 32,
        "9" * 40,
        "2026-11-30T12:00:00+00:00",
    )
    sources = Sources(
        "roofline-fallback",
        "no matching measured profile (data/profiles/target: none stored)",
        (("H100-SXM-80GB", 2.5, "assumption"),),
        (("H100-SXM-80GB", "H100-SXM-80GB/roofline.yaml", "50" * 32, ""),),
    )
    return replace(
        rep,
        table=table,
        curves={names[k]: v for k, v in rep.curves.items()},
        chosen=names[rep.chosen],
        notes=("step times: roofline per candidate", *pruned),
        ledger=ledger,
        provenance=prov,
        sources=sources,
    )


@pytest.fixture
def chosen_records(records):
    rng = np.random.default_rng(0)
    ttft = rng.lognormal(np.log(200), 1.2, 400)  # spans decades, as a loaded deployment's TTFT does
    return records(
        [{"arrival_s": i * 0.05, "ttft_ms": float(t), "itl_ms": 10 + float(t) / 100} for i, t in enumerate(ttft)]
    )


def test_report_renders_in_chromium_complete_and_unclipped(tmp_path, chosen_records):
    rep = _long_named(report(chosen_records))
    page = tmp_path / "capacity.html"
    page.write_text(
        render_html(rep).replace("</body>", CHECK.replace("MIN_INK", str(MIN_INK)) + "</body>"), encoding="utf-8"
    )
    dom = _render(page, tmp_path, f"--window-size={WIDTH},900", "--dump-dom")
    m = re.search(r'<pre id="layout-check">(.*?)</pre>', dom, re.S)
    assert m, "the layout check did not run"
    found = json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    for sid in SECTIONS:
        body = re.search(rf'<section id="{sid}"><h2>[^<]+</h2>(.+?)</section>', dom, re.S)
        assert body and body.group(1).strip(), f"section {sid} missing or empty"
    assert found["problems"] == []
    first = found["first_screen"]
    p = rep.plan
    for text in (
        "Llama-3.1-70B",
        "AzureLLMInferenceTrace_conv.csv",
        f"{p.total_gpus} GPUs",
        f"${p.usd_per_hour:,.2f}/h",
        "every scenario" if rep.fit else "not simulated",
        "ROOFLINE",
    ):
        assert text in first, f"{text!r} not on the first screen"
    assert f"instances\t{rep.chosen}" in first.replace("\u200b", "")  # the pool's row names its configuration
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.write_text(render_html(rep), encoding="utf-8")
    _render(page, tmp_path, f"--window-size={WIDTH},5200", f"--screenshot={SHOTS / 'capacity.png'}")
    assert (SHOTS / "capacity.png").stat().st_size > 10_000


def test_the_check_catches_an_empty_panel_and_an_overflow(tmp_path, chosen_records):
    """The same check on a broken page: a panel with no data and a table wider than the page are reported."""
    rep = replace(_long_named(report(chosen_records)), records=chosen_records.slice(0, 0))
    from llmcap.report import capacity_plots as plots
    from llmcap.report.capacity_sections import figure

    empty = figure(plots.plot_latency_cdfs(None, rep.slo), "latency CDFs without data", panels=2)
    wide = "<table><tr>" + "<td>wide-cell-without-breaks</td>" * 80 + "</tr></table>"
    page = tmp_path / "broken.html"
    page.write_text(
        render_html(rep).replace("</body>", empty + wide + CHECK.replace("MIN_INK", str(MIN_INK)) + "</body>"),
        encoding="utf-8",
    )
    dom = _render(page, tmp_path, f"--window-size={WIDTH},900", "--dump-dom")
    found = json.loads(
        re.search(r'<pre id="layout-check">(.*?)</pre>', dom, re.S)
        .group(1)
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
    )
    problems = "\n".join(found["problems"])
    assert "empty panel 1/2 of latency CDFs without data" in problems and "empty panel 2/2" in problems
    assert "page wider than the viewport" in problems
