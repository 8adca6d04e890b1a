"""Every sample report's HTML page, against the digest recorded in tests/golden_html.json: a refactor changes no
byte of what the tool writes (issue 44). The page is hashed without the inlined plotly.js bundle (the installed
plotly's, not ours) and with the tool's version replaced (a release is no change of output).

When a change is *meant* to change pages, regenerate and review what moved in the JSON and text snapshots:

    python tests/test_golden_html.py --update && git diff tests/golden_html.json
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
from conftest import sample_analysis
from golden_compare import ROOT, SAMPLES

DIGESTS = ROOT / "tests" / "golden_html.json"


def digest(report, analysis=None) -> str:
    from plotly.offline import get_plotlyjs

    from nvtx_trace import __version__
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.report import html

    page = html.render(analysis if analysis is not None else analyze(report))
    bundle = get_plotlyjs().replace("</script", "<\\/script")
    assert page.count(bundle) == 1  # else the digest would hold plotly's bytes
    page = page.replace(bundle, "PLOTLY_JS").replace(f"nvtx-trace {__version__}", "nvtx-trace VERSION")
    return hashlib.sha256(page.encode()).hexdigest()


@pytest.mark.parametrize("report", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_page_matches_the_recorded_digest(report):
    want = json.loads(DIGESTS.read_text()).get(report.stem)
    assert digest(report, sample_analysis(report)) == want, (
        f"{report.name}: the HTML page changed; if meant, run python tests/test_golden_html.py --update")


def test_every_sample_has_a_recorded_digest():
    assert sorted(json.loads(DIGESTS.read_text())) == [p.stem for p in SAMPLES]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_golden_html.py --update")
    DIGESTS.write_text(json.dumps({p.stem: digest(p) for p in SAMPLES}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {DIGESTS.relative_to(ROOT)} ({len(SAMPLES)} pages)")
