"""The HTML report, opened for real in headless Chromium.

What a user relies on: the page draws every chart with no script error, from
file:// with no network; its headline numbers are the JSON output's; a hostile
NVTX or kernel name cannot break out of the page; a report with over a million
GPU intervals still gives a small page that says it was aggregated.

Screenshots go to tests/artifacts/ (or $NVTX_TRACE_ARTIFACTS); their paths are printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from functools import reduce
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, need

from nvtx_trace.analyzer import Analysis, analyze
from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.measures.gpu_idle import (
    CAUSES,
    DeviceIdle,
    IdleResult,
    summarize_causes,
)
from nvtx_trace.analyzer.measures.step_times import StepsResult
from nvtx_trace.analyzer.questions.step_breakdown import breakdown
from nvtx_trace.report import html as html_report
from nvtx_trace.report import json as json_report
from nvtx_trace.report import nvtx_lanes, timeline
from nvtx_trace.units import ms, pct

ARTIFACTS = Path(os.environ.get("NVTX_TRACE_ARTIFACTS", ROOT / "tests" / "artifacts"))
EVIL = '</script><script>window.PWNED=1</script><!-- <img src=x onerror="window.PWNED=2"> &amp; \u2028'
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def chromium() -> str:
    path = chromium_path()
    need("Chromium (apt-get install chromium)", bool(path))
    return path


def open_page(chromium: str, page: Path, tmp: Path, screenshot: Path | None = None) -> tuple[str, str]:
    """Load the page from file:// in a fresh profile; return (DOM after the scripts ran, console log lines)."""
    args = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=30000",
            "--window-size=1400,3000"]
    out = subprocess.run(args + ["--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=180,
                         check=False)
    console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(args + [f"--screenshot={screenshot}", page.resolve().as_uri()], capture_output=True,
                       timeout=180, cwd=tmp, check=False)
        assert screenshot.exists() and screenshot.stat().st_size > 10_000, "no screenshot written"
        print(f"\nscreenshot: {screenshot}")
    return out.stdout, "\n".join(console)


class _Marks(HTMLParser):
    """Attributes of <html> and every headline number (data-key/data-value) of the dumped DOM."""

    def __init__(self):
        super().__init__()
        self.root: dict = {}
        self.nums: list[tuple[str, str, str]] = []
        self._open: tuple[str, str] | None = None
        self.imgs = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.root = a
        if tag == "img":
            self.imgs += 1
        if tag == "span" and "data-key" in a:
            self._open = (a["data-key"], a["data-value"])

    def handle_data(self, data):
        if self._open:
            self.nums.append((*self._open, data))
            self._open = None


def marks(dom: str) -> _Marks:
    p = _Marks()
    p.feed(dom)
    return p


def assert_rendered(dom: str, console: str, figures: int) -> _Marks:
    m = marks(dom)
    assert "data-errors" not in m.root, f"script errors on the page: {m.root.get('data-errors')}"
    assert not re.search(r"Uncaught|Error", console), console
    assert m.root.get("data-plots-expected") == str(figures)
    assert m.root.get("data-plots-rendered") == str(figures), m.root
    traces = json.loads(m.root["data-traces"])
    assert len(traces) == figures and all(n > 0 for n in traces.values()), traces
    return m


def lookup(d: dict, key: str):
    return reduce(lambda obj, k: obj[int(k)] if isinstance(obj, list) else obj[k], key.split("."), d)


# ---- real reports ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def flawed():
    return analyze(ROOT / "sample_reports" / "resnet_flawed_user.sqlite")


@pytest.mark.parametrize("name", ["resnet_flawed_user", "resnet_fixed_user", "resnet50_2workers_h100",
                                  "memory_leak_h200"])
def test_sample_report_page_draws_every_chart_and_its_headline_equals_the_json(name, chromium, tmp_path):
    a = analyze(ROOT / "sample_reports" / f"{name}.sqlite")
    page = html_report.write(a, tmp_path / f"{name}.html")
    dom, console = open_page(chromium, page, tmp_path, screenshot=ARTIFACTS / f"html-report-{name}.png")
    # timeline + per-step breakdown, and GPU memory per step where nvtx_autotrace recorded it
    m = assert_rendered(dom, console, figures=3 if a.memory and a.memory.get("per_step") else 2)
    d = json.loads(json_report.render(a))
    keys = {k for k, _, _ in m.nums}
    must = ["devices.0.utilization", "devices.0.window_utilization", "devices.0.gap_idle_ns",
            "steps.summary.step_ns_median"]
    must += ["idle_causes.window.0.share"] if d["idle_causes"]["window"] else []
    if d["steps"]["summary"]["modes"]:  # steps of two kinds: the mean leads, both kinds are named
        must += ["steps.summary.step_ns_mean", "steps.summary.modes.low_ns", "steps.summary.modes.high_ns"]
    must += ["findings.0.impact_ns"] if d["findings"] else []
    for key in must:
        assert key in keys, f"headline lacks {key}"
    for key, raw, shown in m.nums:
        value = lookup(d, key)
        assert json.loads(raw) == value, key
        fmt = ms if key.endswith("_ns") else pct if key.endswith(("utilization", "fraction", "share")) else None
        if fmt is not None:
            assert shown == fmt(value), (key, shown, value)
    for f in d["findings"]:
        assert f["title"] in _unescape(dom)


def _unescape(dom: str) -> str:
    import html

    return html.unescape(dom)


def test_page_is_self_contained_and_carries_no_host_details(flawed, tmp_path):
    page = html_report.render(flawed)
    assert page.count("* plotly.js v") == 1, "plotly.js must be inlined exactly once"
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|<img[^>]+src=|<iframe", page)
    assert str(ROOT) not in page, "the report's directory (a user path) must not be written"
    host = socket.gethostname()
    if len(host) >= 6:
        assert host not in page
    for var in ("HOME", "USER", "PATH"):
        if len(os.environ.get(var, "")) >= 6:
            assert os.environ[var] not in page
    for div in ("timeline", "steps-chart"):
        assert f"id='{div}'" in page  # fixed ids: other tools and tests can find the charts


def test_cli_writes_the_html_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "r.html"
    def run(*extra):
        return subprocess.run(["nvtx-trace", "analyze", str(ROOT / "sample_reports" / "resnet_flawed_user.sqlite"),
                               "--html", str(out), *extra], capture_output=True, text=True, timeout=120, check=False)
    first = run()
    assert first.returncode == 0, first.stderr
    assert out.stat().st_size > 1_000_000 and f"Wrote {out}" in first.stderr.replace("\n", "")
    assert run().returncode != 0


class DevTools:
    """Just enough of the Chrome DevTools protocol, over --remote-debugging-pipe (fds 3/4, NUL-separated JSON):
    no websocket package needed."""

    def __init__(self, chromium: str, profile: Path):
        r_in, self.w = os.pipe()
        self.r, w_out = os.pipe()
        a, b = os.dup(r_in), os.dup(w_out)

        def fds():
            os.dup2(a, 3), os.dup2(b, 4)
            os.set_inheritable(3, True), os.set_inheritable(4, True)

        self.proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,1000",
                                      "--remote-debugging-pipe"], preexec_fn=fds, close_fds=False,  # noqa: PLW1509 (one thread)
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in (r_in, w_out, a, b):
            os.close(fd)
        self.buf, self.id, self.session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def call(self, method: str, **params):
        self.id += 1
        msg = {"id": self.id, "method": method, "params": params, **({"sessionId": self.session} if self.session else {})}
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            while b"\0" in self.buf:
                raw, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self.id:
                    assert "error" not in reply, reply
                    return reply["result"]
            self.buf += os.read(self.r, 1 << 20)
        raise TimeoutError(method)

    def js(self, expr: str):
        return self.call("Runtime.evaluate", expression=expr, returnByValue=True)["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, button: str = "none"):
        self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button=button, clickCount=1 if button != "none" else 0)

    def close(self):
        self.proc.kill()
        self.proc.wait()


def until(read, done, timeout: float = 10.0):
    """``read()`` again until ``done`` of it (the page draws after the event, later on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_hovering_a_gap_names_its_cause_and_dragging_zooms(flawed, chromium, tmp_path):
    page = html_report.write(flawed, tmp_path / "r.html")
    tools = DevTools(chromium, tmp_path / "profile")
    try:
        tools.call("Page.navigate", url=page.resolve().as_uri())
        deadline = time.monotonic() + 60
        while tools.js("document.documentElement.getAttribute('data-plots-rendered')") is None:
            assert time.monotonic() < deadline, "the charts were never drawn"
            time.sleep(0.05)
        # Hover the first idle-gap bar of the GPU lane.
        x, y = tools.js("""(function () {
            var gd = document.getElementById('timeline');
            var gaps = gd.data.filter(function (t) { return t.type === 'bar' && t.name.indexOf('idle') === 0; });
            var area = gd.querySelector('.nsewdrag').getBoundingClientRect(), best = null, widest = 0;
            Array.prototype.slice.call(gd.querySelectorAll('.barlayer .trace'), 0, gaps.length).forEach(function (t) {
              t.querySelectorAll('.point path').forEach(function (p) {
                var r = p.getBoundingClientRect();
                if (r.left > area.left && r.right < area.right && r.width > widest) { widest = r.width; best = p; }
              });
            });
            best.scrollIntoView({block: 'center'});
            var r = best.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; })()""")
        tools.mouse("mouseMoved", x, y)
        hover = until(lambda: tools.js("document.querySelector('#timeline .hoverlayer').textContent"),
                      lambda text: "cause:" in (text or ""))
        assert "idle" in hover and "cause:" in hover, hover
        assert any(label in hover for label in CAUSES.values()), hover
        # Drag across the middle of the plot: the time axis zooms in.
        before = tools.js("document.getElementById('timeline').layout.xaxis.range.slice()")
        left, top, width, height = tools.js("""(function () {
            var r = document.querySelector('#timeline .nsewdrag').getBoundingClientRect();
            return [r.left, r.top, r.width, r.height]; })()""")
        tools.mouse("mouseMoved", left + width * 0.4, top + height / 2)
        tools.mouse("mousePressed", left + width * 0.4, top + height / 2, "left")
        for f in (0.45, 0.5, 0.55):
            tools.mouse("mouseMoved", left + width * f, top + height / 2, "left")
        tools.mouse("mouseReleased", left + width * 0.55, top + height / 2, "left")
        after = until(lambda: tools.js("document.getElementById('timeline').layout.xaxis.range.slice()"),
                      lambda r: r[1] - r[0] < (before[1] - before[0]) / 3)
        assert after[1] - after[0] < (before[1] - before[0]) / 3, (before, after)
        assert tools.js("document.documentElement.getAttribute('data-errors')") is None
    finally:
        tools.close()


# ---- escaping ------------------------------------------------------------------------------------

def test_embedded_json_cannot_end_the_script_element():
    text = html_report.script_json({"name": EVIL, "list": ["-->", "<!--", "</SCRIPT >"]})
    assert "<" not in text and ">" not in text and "\u2028" not in text
    assert json.loads(text) == {"name": EVIL, "list": ["-->", "<!--", "</SCRIPT >"]}


def test_hostile_nvtx_and_kernel_names_stay_text(chromium, tmp_path):
    a, ranges, threads = synthetic_analysis(n_busy=2_000, n_ranges=400, evil=True)
    page = tmp_path / "evil.html"
    page.write_text(html_report.render(a, ranges=ranges, thread_labels=threads))
    raw = page.read_text()
    outside_scripts = re.sub(r"(?s)<script\b[^>]*>.*?</script>", "", raw)
    assert EVIL not in raw and "<img" not in outside_scripts and "PWNED=1</script>" not in raw
    dom, console = open_page(chromium, page, tmp_path, screenshot=ARTIFACTS / "html-report-hostile-names.png")
    m = assert_rendered(dom, console, figures=2)
    assert m.imgs == 0, "an NVTX/kernel name became an element"
    probe = tmp_path / "probe.html"  # the page's own globals: did any injected script run?
    probe.write_text(raw.replace("</body>", "<script>document.documentElement.setAttribute('data-pwned', "
                                            "String(window.PWNED || 'no'))</script></body>"))
    dom2, _ = open_page(chromium, probe, tmp_path)
    assert marks(dom2).root.get("data-pwned") == "no"
    assert "window.PWNED=1" in _unescape(dom)  # ...and the name is still shown, as text


# ---- large reports -------------------------------------------------------------------------------

def synthetic_analysis(n_busy: int, n_ranges: int, evil: bool = False, n_steps: int = 2_000):
    """An Analysis shaped like a long real run: n_busy GPU intervals, steps, gaps, NVTX on a main thread,
    an autograd thread and four DataLoader worker processes."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(2_000, 40_000, n_busy)
    holes = rng.choice([500, 3_000, 20_000, 2_500_000], n_busy, p=[0.6, 0.3, 0.0995, 0.0005])
    starts = np.cumsum(lengths + holes) - lengths
    ends = starts + lengths
    t_end = int(ends[-1])
    hole_s, hole_e = ends[:-1], starts[1:]
    big = (hole_e - hole_s) >= 1_000_000
    gaps = pd.DataFrame({"device_id": 0, "start_ns": hole_s[big], "end_ns": hole_e[big]})
    gaps["duration_ns"] = gaps["end_ns"] - gaps["start_ns"]
    keys = list(CAUSES)
    pick = rng.integers(0, len(keys), len(gaps))
    for i, k in enumerate(keys):
        gaps[f"{k}_ns"] = np.where(pick == i, gaps["duration_ns"], 0)
    gaps["cause"] = np.array(keys)[pick]
    dev = DeviceIdle(device_id=0, name="Synthetic GPU", pids=[100], span_start_ns=int(starts[0]), span_end_ns=t_end,
                     busy_ns=int(lengths.sum()), gap_count=len(gaps), gap_idle_ns=int(gaps["duration_ns"].sum()),
                     busy=(starts.astype(np.int64), ends.astype(np.int64)))
    edges = np.linspace(0, t_end, n_steps + 1).astype(np.int64)
    steps = pd.DataFrame({"step": np.arange(n_steps), "start_ns": edges[:-1], "end_ns": edges[1:]})
    steps["duration_ns"] = steps["end_ns"] - steps["start_ns"]
    steps["gpu_busy_ns"] = (steps["duration_ns"] * 0.6).astype(np.int64)
    steps["loader_wait_ns"] = (steps["duration_ns"] * 0.2).astype(np.int64)
    steps["sync_wait_ns"] = 0
    steps["warmup"] = steps["step"] < 1
    steps.loc[0, "end_ns"] = steps.loc[0, "start_ns"] + steps.loc[0, "duration_ns"]
    name = EVIL if evil else "forward layer1.0.conv1 (Conv2d)"
    # NVTX: step ranges + nested module ranges on the main thread; fetches in 4 worker processes.
    per = max(n_ranges // (n_steps * 2), 1)
    main = []
    for i in range(n_steps):
        s0, s1 = int(edges[i]), int(edges[i + 1])
        main.append((s0, s1, 1, f"step {i}"))
        sub = np.linspace(s0, s1, per + 1).astype(np.int64)
        main += [(int(sub[j]) + 1, int(sub[j + 1]) - 1, 1, name if j % 2 else "dataloader.next [train.py:1]")
                 for j in range(per)]
    workers = [(int(edges[i]), int(edges[i]) + int(steps["duration_ns"].iloc[i] * 3), 10 + w,
                f"dataloader.fetch [train.py:1] worker {w}") for i in range(0, n_steps, 4) for w in range(4)]
    rows = pd.DataFrame(main + workers + [(0, t_end, 2, "backward")], columns=["start_ns", "end_ns", "tid", "name"])
    pid = np.where(rows["tid"] >= 10, 200 + rows["tid"], 100)
    rows["gtid"] = (pid << 24) | rows["tid"]
    rows["pid"] = pid
    rows["name"] = rows["name"].astype("category")
    threads = {int(g): (f"python3[{int(g) >> 24}] tid {int(g) & 0xFFFFFF}"
                        + (" (pt_data_worker)" if (int(g) & 0xFFFFFF) >= 10 else "")) for g in rows["gtid"].unique()}
    if evil:
        threads[int(rows["gtid"].iloc[0])] = EVIL
    w0, w1 = int(steps["start_ns"].iloc[1]), t_end
    a = Analysis(path=Path("synthetic.sqlite"), nsys_version="2025.3.2", schema_version="3.20.3",
                 min_gap_ns=1_000_000, trace_start_ns=0, trace_end_ns=t_end,
                 findings=[Finding(kind="gpu_idle", title=f"idle around {name}", impact_ns=123_456_789,
                                   fix=f"rename {name}", evidence={"range": name, "idle_ns": 5})])
    results = dict(  # what the questions would have set (analysis.<question name>)
        idle=IdleResult(devices=[dev], gaps=gaps, causes=summarize_causes(gaps)),
        steps=StepsResult(table=steps, source="`step N` ranges", warmup_steps=1, pid=1),
        window={"start_ns": w0, "end_ns": w1, "source": f"steady-state steps 1-{n_steps - 1}"},
        window_causes=summarize_causes(gaps, (w0, w1)), window_utilization={0: 0.6},
        top_kernels=pd.DataFrame({"name": [EVIL if evil else "sgemm", "relu"], "count": [10, 5],
                                  "time_ns": [1_000_000, 20_000]}))
    for attr, value in results.items():
        setattr(a, attr, value)
    a.step_breakdown = breakdown(a)
    return a, rows, threads


def test_million_interval_report_stays_small_and_says_it_was_aggregated(tmp_path):
    a, ranges, threads = synthetic_analysis(n_busy=1_200_000, n_ranges=300_000)
    t = time.perf_counter()
    page = html_report.render(a, ranges=ranges, thread_labels=threads)
    took = time.perf_counter() - t
    size = len(page.encode())
    print(f"\n1.2M busy intervals, {len(ranges):,} NVTX ranges: {size / 1e6:.2f} MB in {took:.1f} s")
    assert size < 10_000_000
    assert "Aggregated to keep this page small" in page and "--html-max-points" in page
    drawn = re.search(r"1,200,000 busy intervals drawn as ([\d,]+) blocks", page)
    assert drawn and int(drawn.group(1).replace(",", "")) <= 10_000
    tl = timeline.build(a, ranges, threads)
    assert tl.items <= timeline.DEFAULT_MAX_POINTS * 1.1
    assert any("worker" in lab for lab in tl.figure["layout"]["yaxis"]["ticktext"]), "worker processes get lanes"
    (tmp_path / "big.html").write_text(page)
    if chromium_path():  # drawing it must work too; the load time is measured in the report, not asserted
        t = time.perf_counter()
        dom, console = open_page(chromium_path(), tmp_path / "big.html", tmp_path,
                                 screenshot=ARTIFACTS / "html-report-synthetic-1.2M.png")
        print(f"chromium load + draw + dump: {time.perf_counter() - t:.1f} s")
        assert_rendered(dom, console, figures=2)


def test_busy_cap_closes_the_shortest_holes_first():
    s, e = np.array([0, 10, 20, 100, 110]), np.array([5, 18, 30, 105, 120])  # holes 5, 2, 70, 5
    s2, e2, closed = timeline.cap_busy(s, e, 3)
    assert s2.tolist() == [0, 100, 110] or s2.tolist() == [0, 20, 100]
    assert len(s2) == 3 and closed == 5 and e2[-1] == 120
    assert timeline.cap_busy(s, e, 10)[2] == 0
    s3, e3, _ = timeline.cap_busy(np.array([0, 10, 1000]), np.array([5, 900, 1001]), 2)
    assert s3.tolist() == [0, 1000] and e3.tolist() == [900, 1001]  # the 100-long hole survives, the 5 closes


def test_nesting_depth_of_push_pop_ranges():
    s = np.array([0, 1, 2, 5, 10])
    e = np.array([9, 4, 3, 8, 12])
    assert nvtx_lanes.nesting_depth(s, e).tolist() == [0, 1, 2, 1, 0]


def test_without_plotly_the_html_is_one_line_and_a_run_keeps_its_other_outputs(tmp_path, monkeypatch, capsys):
    """plotly is a dependency, but an environment can lack it (seen on the GPU machine): analyze --html says
    what to install in one line; run's summary.json and findings stand, the missing HTML is one problem line."""
    import sys

    from nvtx_trace import cli, runner
    from nvtx_trace.runner.plan import Plan

    monkeypatch.setitem(sys.modules, "plotly.offline", None)  # import plotly.offline now raises ImportError
    sample = ROOT / "sample_reports" / "cpu_slow_loader.sqlite"
    code = cli.main(["analyze", str(sample), "--html", str(tmp_path / "s.html")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "pip install plotly" in err[0] and "Traceback" not in err[0], err
    assert not (tmp_path / "s.html").exists()
    plan = Plan(nsys=None, out_dir=tmp_path, argv=["x"], env={}, trace=[], extra=[], capture="", mode="script")
    result = runner.RunResult(plan=plan, exit_code=0, analysis=analyze(sample))
    runner.write_summaries(result)
    assert result.written == [tmp_path / "summary.json"] and result.error is None
    assert result.problems == ["no HTML summary: the HTML summary needs plotly, which is not installed here: "
                               "pip install plotly"]


# ---- the timeline's legend and step labels, the per-step breakdown of a run without GPU activity ------------

LEGEND_SAMPLES = ["cpu_slow_loader", "resnet_flawed_user", "resnet50_2workers_h100"]


def page_figures(page: str) -> dict:
    """The figures as the page embeds them (what the browser draws), by div id, with their page-side specs."""
    raw = re.search(r'<script type="application/json" id="nvtx-trace-data">(.*?)</script>', page, re.S).group(1)
    return {f["div"]: f for f in json.loads(raw)["figures"]}


def painted(t: dict) -> set[str]:
    """The colours a trace paints with meaning: bars' fill, lines, area fills, markers (not the step labels'
    text, not the white outline that keeps neighbouring step bars apart)."""
    if t["type"] == "bar":
        c = t["marker"]["color"]
        return set(c) if isinstance(c, list) else {c}
    mode = t.get("mode", "")
    return ({t["line"]["color"]} if "lines" in mode else set()) | ({t["fillcolor"]} if t.get("fill") else set()) \
        | ({t["marker"]["color"]} if "markers" in mode else set())


def draws(t: dict) -> bool:
    return any(x is not None for x in t.get("x", []))


def assert_legend_names_every_colour(fig: dict) -> list[dict]:
    """Every colour drawn belongs to exactly one legend entry of that colour, and every entry's colour is drawn;
    returns the entries (traces with showlegend) in legend order."""
    data = fig["data"]
    holders = [t for t in data if t.get("showlegend")]
    by_group = {}
    for t in holders:
        assert t.get("legendgroup") and t["legendgroup"] not in by_group, t["name"]
        by_group[t["legendgroup"]] = t
    used = set()
    for t in data:
        if not draws(t) or not painted(t):
            continue
        assert t.get("legendgroup") in by_group, f"{t['name']} draws {painted(t)} but no legend entry names it"
        assert painted(t) <= painted(by_group[t["legendgroup"]]), (t["name"], by_group[t["legendgroup"]]["name"])
        used |= painted(t)
    # The steady window is a shaded rectangle (a layout shape), named by its own entry; the one line shape only
    # divides the GPU and step lanes from the NVTX lanes.
    shades = {s["fillcolor"] for s in fig["layout"]["shapes"] if s["type"] == "rect"}
    used |= shades
    listed = set().union(*(painted(t) for t in holders)) if holders else set()
    assert listed == used, (f"named but not drawn: {listed - used}", f"drawn but not named: {used - listed}")
    names = [t["name"] for t in holders]
    assert all(names) and len(set(names)) == len(names), names
    colours = [frozenset(painted(t)) for t in holders]
    assert len(set(colours)) == len(colours), "two legend entries of one colour"
    return sorted(holders, key=lambda t: t.get("legendrank", 1000))


@pytest.mark.parametrize("name", LEGEND_SAMPLES + ["resnet_ddp_flawed", "synthetic"])
def test_the_timeline_legend_names_exactly_the_colours_it_draws(name):
    if name == "synthetic":  # every idle cause, NVTX on an autograd thread and in four worker processes
        a, ranges, threads = synthetic_analysis(n_busy=20_000, n_ranges=4_000)
        page = html_report.render(a, ranges=ranges, thread_labels=threads)
    else:
        page = html_report.render(analyze(ROOT / "sample_reports" / f"{name}.sqlite"))
    fig = page_figures(page)["timeline"]["figure"]
    entries = assert_legend_names_every_colour(fig)
    assert fig["layout"]["showlegend"] is True
    names = [t["name"] for t in entries]
    assert any(n.split(" · ")[0] == "step" for n in names)
    assert ("step boundary" in names) == (name != "synthetic")  # 2,000 boundaries: drawn on the steps lane only
    if name == "cpu_slow_loader":  # no GPU: NVTX colours, steps, the steady window
        assert not any(n.startswith(("idle:", "GPU")) for n in names), names
        assert any(n.startswith("data-loading ranges") for n in names), names
    else:
        assert names[:2] == ["GPU utilization (height: busy share of a time bin)",
                             "GPU busy (shade: busy share of a block)"], names
        assert any(n.startswith("idle: ") for n in names), names
        if name != "synthetic":  # loader-bound samples: the largest cause first, one entry with its ranges
            assert names[2] == "idle: waiting for the next batch · data-loading ranges (waits, worker fetches)"


def step_label_view(tools: DevTools) -> dict:
    """The steps lane as drawn now: each step bar's middle, whether it lies in view, its label, its key for the
    every-k-th rule; k and the lane's name; the page boxes of the labels drawn inside the plot area."""
    return tools.js("""(function () {
        var gd = document.getElementById('timeline');
        var spec = JSON.parse(document.getElementById('nvtx-trace-data').textContent).figures
            .filter(function (f) { return f.div === 'timeline'; })[0].step_labels;
        var r = gd._fullLayout.xaxis.range.map(Number), t = gd.data[spec.index];
        var area = gd.querySelector('.nsewdrag').getBoundingClientRect();
        var boxes = Array.prototype.map.call(gd.querySelectorAll('.scatterlayer .textpoint text'), function (e) {
            var b = e.getBoundingClientRect();
            return {text: e.textContent, l: b.left, r: b.right, t: b.top, b: b.bottom};
        }).filter(function (b) {
            var x = (b.l + b.r) / 2;
            return b.text && x >= area.left && x <= area.right;
        });
        return {k: Number(gd.getAttribute('data-step-label-every')), tick: gd._fullLayout.yaxis.ticktext[spec.lane],
                lane_name: spec.lane_name, range: r, view: gd._stepLabelView,
                bars: t.x.map(function (x, i) {
                    return {x: x, key: spec.keys[i], text: t.text[i], long: spec.long[i], short: spec.short[i],
                            shown: x >= r[0] && x <= r[1]}; }),
                boxes: boxes};
    })()""")


def assert_step_labels_follow_the_rule(view: dict) -> int:
    """Every step bar in view is labelled, or, with k > 1, exactly those whose key is a multiple of k, and the
    lane's name says so; no two labels drawn overlap. Returns k."""
    k = view["k"]
    in_view = [b for b in view["bars"] if b["shown"]]
    assert k >= 1 and in_view, view["range"]
    for b in in_view:
        assert bool(b["text"]) == (b["key"] % k == 0), (k, b)
        assert not b["text"] or b["text"] in (b["long"], b["short"]), b
    if k == 1:
        assert view["tick"] == view["lane_name"]
    else:
        assert f"every {k}" in view["tick"] and "labelled" in view["tick"], view["tick"]
    labelled = sum(1 for b in in_view if b["text"])
    assert len(view["boxes"]) >= labelled - 2, "labels in view were not drawn"  # two may sit at the edges
    boxes = sorted(view["boxes"], key=lambda b: b["l"])
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if b["l"] >= a["r"]:
                break
            assert b["t"] >= a["b"] or a["t"] >= b["b"], f"labels {a['text']} and {b['text']} overlap"
    return k


def zoom(tools: DevTools, update: str) -> dict:
    """Relayout the timeline, wait for the labels to follow the new view, and return it."""
    before = tools.js("document.getElementById('timeline')._stepLabelView")
    relayout = f"Plotly.relayout(document.getElementById('timeline'), {update}).then(function () {{ return 1; }})"
    tools.call("Runtime.evaluate", expression=relayout, awaitPromise=True, returnByValue=True)
    deadline = time.monotonic() + 30
    while True:
        view = step_label_view(tools)
        if view["view"] != before and view["view"] == ",".join(str(x) for x in view["range"]) + "/" + str(
                tools.js("document.getElementById('timeline')._fullLayout.xaxis._length")):
            time.sleep(0.3)
            again = step_label_view(tools)
            if again["view"] == view["view"]:
                return again
        assert time.monotonic() < deadline, "the step labels did not follow the zoom"
        time.sleep(0.1)


def open_devtools(chromium: str, page: Path, tmp: Path) -> DevTools:
    tools = DevTools(chromium, tmp / "profile")
    tools.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)
    tools.call("Page.navigate", url=page.resolve().as_uri())
    deadline = time.monotonic() + 60
    while tools.js("document.documentElement.getAttribute('data-plots-rendered')") is None:
        assert time.monotonic() < deadline, "the charts were never drawn"
        time.sleep(0.05)
    assert tools.js("document.documentElement.getAttribute('data-errors')") is None
    return tools


@pytest.mark.parametrize("name", LEGEND_SAMPLES)
def test_the_legend_is_on_the_page_and_every_step_in_view_is_labelled(name, chromium, tmp_path):
    """At the page's opening view (1400 px wide) each step of the window carries its label; zoomed out to the
    whole trace, or into three steps, the labels follow the rule; the legend is drawn without hovering, one
    entry per colour, each with its swatch."""
    page = html_report.write(analyze(ROOT / "sample_reports" / f"{name}.sqlite"), tmp_path / f"{name}.html")
    entries = assert_legend_names_every_colour(page_figures(page.read_text())["timeline"]["figure"])
    tools = open_devtools(chromium, page, tmp_path)
    try:
        legend = tools.js("""Array.prototype.map.call(document.querySelectorAll('#timeline .legend .traces'),
            function (e) {
                var b = e.getBoundingClientRect(), fills = [];
                e.querySelectorAll('path').forEach(function (p) {
                    var s = getComputedStyle(p); fills.push(s.fill, s.stroke); });
                return {text: e.querySelector('.legendtext').textContent, w: b.width, h: b.height, fills: fills};
            })""")
        assert [x["text"] for x in legend] == [t["name"] for t in entries]
        for x, t in zip(legend, entries):
            assert x["w"] > 0 and x["h"] > 0, x
            rgb = {_rgb(c) for c in painted(t)}
            assert rgb & {_rgb(c) for c in x["fills"] if c.startswith("rgb")}, (x, painted(t))
        opening = step_label_view(tools)
        assert assert_step_labels_follow_the_rule(opening) == 1, "a step of the opening view lost its label"
        assert all(b["text"] for b in opening["bars"] if b["shown"])
        whole = zoom(tools, "{'xaxis.autorange': true}")
        assert whole["range"][1] - whole["range"][0] > opening["range"][1] - opening["range"][0]
        assert_step_labels_follow_the_rule(whole)
        xs = [b["x"] for b in opening["bars"] if b["shown"]]
        mid = len(xs) // 2
        close = zoom(tools, f"{{'xaxis.range': [{xs[mid - 2]}, {xs[mid + 2]}]}}")
        assert assert_step_labels_follow_the_rule(close) == 1
        assert sum(b["shown"] for b in close["bars"]) >= 3
        assert tools.js("document.documentElement.getAttribute('data-errors')") is None
    finally:
        tools.close()


def _rgb(colour: str) -> tuple[int, int, int]:
    """'#ef6c00', 'rgb(239, 108, 0)' or 'rgba(46,125,50,0.5)' as an (r, g, b) triple (the alpha left out)."""
    if colour.startswith("#"):
        return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return tuple(int(float(v)) for v in re.findall(r"[\d.]+", colour)[:3])


def test_thousands_of_steps_are_labelled_every_kth_and_the_lane_says_which(chromium, tmp_path):
    """2,000 steps drawn as 1,000 bars of two: at the opening view labels cannot all fit, so every k-th bar
    is labelled (k > 1, the lane's name says it); zoomed into a few bars, each has its label again."""
    a, ranges, threads = synthetic_analysis(n_busy=20_000, n_ranges=4_000)
    page = tmp_path / "steps.html"
    page.write_text(html_report.render(a, ranges=ranges, thread_labels=threads))
    tools = open_devtools(chromium, page, tmp_path)
    try:
        opening = step_label_view(tools)
        k = assert_step_labels_follow_the_rule(opening)
        assert k > 1 and "every" in opening["tick"] and "bar" in opening["tick"], opening["tick"]
        assert opening["bars"][0]["long"] == "steps 0-1"
        xs = [b["x"] for b in opening["bars"]]
        close = zoom(tools, f"{{'xaxis.range': [{xs[500]}, {xs[504]}]}}")
        assert assert_step_labels_follow_the_rule(close) == 1
    finally:
        tools.close()


def test_a_run_without_gpu_activity_gets_per_step_bars_whose_loader_waits_are_the_sql_ones(chromium, tmp_path):
    """The CPU sample (`nvtx-trace run` under Debian's nsys 2022.4, no GPU): one bar per step, warm-up first,
    each split into waiting for data and the rest; the waits are recomputed here from the report in plain SQL:
    the training process's `dataloader.next` ranges, clipped to each `step N` range that holds an optimizer
    step (the last `step N`, opened by the final optimizer step and running until exit, is not a step)."""
    import sqlite3

    path = ROOT / "sample_reports" / "cpu_slow_loader.sqlite"
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    text = "COALESCE(s.value, n.text)"
    named = f"FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.end IS NOT NULL AND {text}"
    sql = f"""
        WITH main AS (SELECT n.globalTid AS tid {named} LIKE 'step %' GROUP BY n.globalTid
                      ORDER BY count(*) DESC LIMIT 1),
             step AS (SELECT CAST(substr({text}, 6) AS INTEGER) AS k, n.start, n.end {named} LIKE 'step %'
                      AND n.globalTid = (SELECT tid FROM main)),
             opt AS (SELECT n.end {named} LIKE 'optimizer.step %'),
             wait AS (SELECT n.start, n.end {named} LIKE 'dataloader.next [%'
                      AND (n.globalTid >> 24) = ((SELECT tid FROM main) >> 24))
        SELECT step.k, step.end - step.start,
               (SELECT COALESCE(sum(max(0, min(wait.end, step.end) - max(wait.start, step.start))), 0) FROM wait)
        FROM step WHERE EXISTS (SELECT 1 FROM opt WHERE opt.end BETWEEN step.start AND step.end) ORDER BY step.start"""
    want = con.execute(sql).fetchall()
    con.close()
    assert len(want) == 12 and all(w > 0 for _, _, w in want[:8]), want

    a = analyze(path)
    d = json.loads(json_report.render(a))
    rows = d["step_breakdown"]
    assert [(r["step"], r["duration_ns"], r["loader_ns"]) for r in rows] == [tuple(w) for w in want]
    assert all(r["cpu_ns"] == r["duration_ns"] - r["loader_ns"] for r in rows)
    assert all(r[k] is None for r in rows for k in ("compute_ns", "copy_ns", "sync_ns", "other_ns"))
    page = html_report.write(a, tmp_path / "cpu.html")
    raw = page.read_text()
    chart = page_figures(raw)["steps-chart"]["figure"]
    bars = {t["name"]: t for t in chart["data"]}
    assert list(bars) == ["waiting for data (in the DataLoader)", "the rest: the training thread's own CPU work"]
    steady = d["steps"]["summary"]["steady_steps"]
    warm = [str(r["step"]) for r in rows if r["warmup"]]
    for t in bars.values():  # one bar per step, warm-up ones first, then one per steady step
        assert t["x"] == warm + [str(r["step"]) for r in rows if not r["warmup"]]
        assert len(t["x"]) - len(warm) == steady == 11
    assert bars["waiting for data (in the DataLoader)"]["y"] == [round(w / 1e6, 4) for _, _, w in want]
    assert "No per-step breakdown" not in raw and "Where the time goes: cpu_slow_loader.sqlite" in raw
    assert "GPU busy n/a" not in raw and "No GPU activity traced; waiting for data" in raw
    dom, console = open_page(chromium, page, tmp_path, screenshot=ARTIFACTS / "html-report-cpu_slow_loader.png")
    assert_rendered(dom, console, figures=2)
    assert dom.count('class="legendtext"') >= 2 + 5  # the step chart's two parts and the timeline's colours


TUNES = sorted((ROOT / "sample_reports" / "tune").glob("*.tune.json"))


@pytest.mark.parametrize("tuned", TUNES, ids=[p.stem for p in TUNES])
def test_tune_page_shows_what_to_keep_as_code_the_bars_and_each_stage_s_report(tuned, chromium, tmp_path):
    """Issue 51, item 8: tune.html of real tune runs (H200, programs/options/device_run.sh): the changes to keep as
    code blocks (the tuned command line first where the program's own options were kept), a bar per configuration
    with its share of the peak, a link to each stage's profile report, and no list of terminal lines."""
    import html

    from nvtx_trace.report import tune_render

    d = json.loads(tuned.read_text())
    page = tmp_path / "tune.html"
    page.write_text(tune_render.html(d), encoding="utf-8")
    dom, console = open_page(chromium, page, tmp_path)
    assert "Uncaught" not in console and "<pre class=\"keep\">" in dom.replace("'", '"')
    if any(p["through_option"] for p in d["permanent"]):
        assert html.escape(" ".join(d["command"][1:])) in dom  # the tuned command, as the user runs it
    for p in d["permanent"]:
        assert all(html.escape(line, quote=False) in dom for line in p["lines"])
    assert dom.count("class=\"bar\"") == len((d["flops"] or {}).get("stages") or []) or not d["flops"]
    for s in (s for s in d["stages"] if s["profile"]):  # a stage that reused a profile links to that one
        assert f"href=\"{Path(s['profile']).parent.name}/profile/summary.html\"" in dom
    assert html.escape(tune_render.headline(d), quote=False) in dom and "<li>  stage" not in dom


def test_the_timeline_colours_ranges_by_the_loader_pattern_the_user_gave():
    """Issue 54, item 2: the HTML classified NVTX ranges with the default loader pattern, whatever --loader-pattern
    said, so the page could disagree with the analysis. The analysis gives each range name its colour key; the
    renderer looks it up. Here a pattern that makes `optimizer.zero_grad` a loader wait (a contrived one: the
    shipped CPU sample has no range only a custom pattern would name)."""
    from nvtx_trace.report import nvtx_lanes

    sample = ROOT / "sample_reports" / "cpu_slow_loader.sqlite"
    default, custom = analyze(sample), analyze(sample, loader_pattern=r"^optimizer\.zero_grad")
    name = "optimizer.zero_grad (SGD)"
    assert default.nvtx_categories[name] == "optimizer" and custom.nvtx_categories[name] == "dataloader"
    assert custom.nvtx_categories["dataloader.next [slow_loader_train.py:53]"] == "dataloader"
    for a, want in ((default, "optimizer"), (custom, "dataloader")):
        lanes, _ = nvtx_lanes.build(a.nvtx_ranges, a.nvtx_threads, 500, [], [], 0, categories=a.nvtx_categories)
        assert set(lanes.loc[lanes["name"].astype(str) == name, "cat"]) == {want}
