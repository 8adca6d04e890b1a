"""The kernel mix (``kernels`` in summary.json): GPU work in the steady window by kind, checked against SQL
written here from the export's own tables, and the name rules (docs/kernel-categories.md) on the real kernel
names of the sample reports (H100/H200 captures, nsys 2025.3; the 2022.4 sample is CPU-only)."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import SAMPLES, sample_analysis

from nvtx_trace.analyzer import analyze
from nvtx_trace.analyzer.questions.kernels import LABELS, category

GPU_SAMPLES = [p for p in sorted(SAMPLES.glob("*.sqlite")) if p.stem != "cpu_slow_loader"]


def _sql_by_category(path, lo: int, hi: int) -> dict[str, tuple[int, int]]:
    """(count, GPU time) per category of every kernel, copy and memset starting in [lo, hi), by SQL."""
    out: dict[str, list[int]] = {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT s.value, d.value, count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = k.shortName JOIN StringIds d ON d.id = k.demangledName "
            "WHERE k.start >= ? AND k.start < ? AND k.end >= k.start GROUP BY k.shortName, k.demangledName",
            (lo, hi)).fetchall()
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, cat in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
            if table not in tables:
                continue
            n, t = db.execute(f"SELECT count(*), sum(end - start) FROM {table} WHERE start >= ? AND start < ? "
                              "AND end >= start", (lo, hi)).fetchone()
            if n:
                rows.append((cat, None, n, t))
    for short, long, n, t in rows:
        cat = short if long is None else category(short, long)
        acc = out.setdefault(cat, [0, 0])
        acc[0] += n
        acc[1] += t
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize("report", GPU_SAMPLES, ids=[p.stem for p in GPU_SAMPLES])
def test_each_category_equals_sql_and_the_shares_add_up(report):
    a = sample_analysis(report)
    k = a.kernels
    by_sql = _sql_by_category(report, a.window["start_ns"], a.window["end_ns"])
    mine = {r.category: (int(r.count), int(r.time_ns)) for r in k.by_category.itertuples()}
    assert mine == by_sql
    assert k.time_ns == sum(t for _, t in by_sql.values())
    assert k.by_category["share"].sum() == pytest.approx(1.0)
    assert k.by_name["time_ns"].sum() == k.time_ns  # every kernel listed by name once
    if k.steps:
        assert k.steps == len(a.steps.steady)
        assert (k.by_category["time_ns_per_step"] * k.steps * k.gpus).sum() == pytest.approx(k.time_ns)


def _shares(stem: str) -> dict[str, float]:
    k = sample_analysis(SAMPLES / f"{stem}.sqlite").kernels
    return dict(zip(k.by_category["category"], k.by_category["share"]))


def test_fp32_gemms_without_tensor_cores_are_named_so_short_names_hiding_the_math_included():
    """The DDP sample runs fp32 matmuls with TF32 off: cuBLAS's sm80_xmma_..._ffma kernels and CUTLASS's
    ``Kernel2`` (demangled: cutlass_80_simt_sgemm) are fp32 on CUDA cores; none is called a tensor-core GEMM."""
    k = sample_analysis(SAMPLES / "ddp_balanced_h200x2.sqlite").kernels
    gemms = k.by_name[k.by_name["category"].str.startswith("gemm")]
    assert set(gemms["category"]) == {"gemm_fp32"}
    assert any(n.startswith("Kernel2<cutlass_80_simt_sgemm") for n in gemms["name"])
    assert _shares("ddp_balanced_h200x2")["collective"] > 0.2  # the NCCL all-reduces


def test_each_sample_s_math_is_what_its_program_ran():
    """bf16 autocast GPT-2 (cuBLASLt nvjet_*_tst_* GEMMs, cuDNN SDPA), fp32 ResNet-50 with cuDNN's default TF32
    convolutions, fp16 autocast ResNet-18 (the flawed example): the GEMM/convolution math follows the program."""
    gpt = _shares("gpt2_plain_nsys_h100")
    assert gpt["gemm_bf16"] > 0.25 and gpt["attention"] > 0.05
    assert not any(c in gpt for c in ("gemm_fp32", "gemm_tf32", "gemm_fp16"))
    assert gpt["elementwise"] + gpt["norm_softmax"] > 0.3  # the eager program's unfused kernels
    resnet = _shares("resnet50_2workers_h100")
    assert resnet["conv_tf32"] > 0.1 and resnet["layout_transpose"] > 0.05
    assert "conv_fp32" not in resnet
    flawed = _shares("resnet_flawed")
    assert flawed["conv_fp16"] > 0.05 and "conv_tf32" not in flawed


@pytest.mark.parametrize("short, demangled, expected", [
    ("Kernel2", "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(T1::Params)", "gemm_tf32"),
    ("Kernel", "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop_optimized_f16_256x64_32x4_nhwc_align8>"
     "(T1::Params)", "conv_fp16"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", None, "gemm_bf16"),
    ("convert_dq_to_16bits", "void cudnn::fusion::convert_dq_to_16bits<(bool)1>(const void *)", "attention"),
    ("triton_per_fused_native_layer_norm_0", None, "triton"),
    ("implicit_convolve_sgemm", None, "conv_fp32"),
    ("nvjet_sm90_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", None, "gemm_fp16"),
])
def test_documented_name_rules(short, demangled, expected):
    assert category(short, demangled) == expected
    assert expected in LABELS


def test_a_cpu_only_report_skips_the_kernel_mix_with_the_reason():
    a = analyze(SAMPLES / "cpu_slow_loader.sqlite")  # nsys 2022.4, export schema 3.0.0
    assert a.kernels is None and "GPU activity" in a.skipped["kernels"]


def test_every_short_name_that_needs_its_demangled_form_is_found_by_the_hints():
    """The kernel table's one pass brings demangled names only for the short names the SQL LIKE hints find among
    the report's strings: every such name in every sample report and held-out capture must be found."""
    import lzma
    import re

    from nvtx_trace.analyzer.questions.kernels import DEMANGLE_HINTS, needs_demangled

    def like(value: str) -> bool:
        return any(re.fullmatch(h.replace("%", ".*"), value, re.I | re.S) for h in DEMANGLE_HINTS)

    reports = [p.read_bytes() for p in GPU_SAMPLES] + [lzma.open(p).read() for p in (SAMPLES / "busy").glob("*.xz")]
    missed = set()
    for data in reports:
        db = sqlite3.connect(":memory:")
        db.deserialize(data)
        for (name,) in db.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                  "JOIN StringIds s ON s.id = k.shortName"):
            if needs_demangled(name) and not like(name):
                missed.add(name)
    assert not missed


@pytest.mark.parametrize("stem", ["resnet_flawed", "ddp_straggler_rank0_h200x2"])
def test_kernels_under_one_wave_equal_sql(stem):
    """Kernels with fewer thread blocks than their GPU's SMs (TARGET_INFO_GPU.smCount) in the window, by SQL over
    the export's own grid sizes; NCCL's left out (few blocks by design), and GEMM/convolution/attention kernels
    (persistent: one block per SM or fewer) counted apart."""
    path = SAMPLES / f"{stem}.sqlite"
    a = sample_analysis(path)
    con = sqlite3.connect(path)
    try:
        rows = con.execute(
            "SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            "JOIN TARGET_INFO_GPU g ON g.id = k.deviceId WHERE k.gridX * k.gridY * k.gridZ < g.smCount "
            "AND k.start >= ? AND k.start < ?", (a.window["start_ns"], a.window["end_ns"])).fetchall()
    finally:
        con.close()
    compute = [(n, t) for n, t in rows if category(n) != "collective"]
    plain = [(n, t) for n, t in compute if not category(n).startswith(("gemm", "conv", "attention", "triton"))]
    assert a.kernels.under_one_wave == {"count": len(compute), "time_ns": sum(t for _, t in compute),
                                        "non_matrix_count": len(plain), "non_matrix_time_ns": sum(t for _, t in plain)}
    assert len(plain) < len(compute) < len(rows) or stem == "resnet_flawed"
