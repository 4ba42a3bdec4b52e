"""The report of ``bench/gpu.py``'s measurements (``gpu.json``): one Markdown page a reviewer reads beside
the figures — whether every grid's bytes on the device equal the CPU reference, the learner's GEMM
layers per micro-batch against BF16, the cost-model fits, and the fingerprint against a device copy.

Every number in it is a ratio against a baseline measured in the same run (``bench/gpu.py``), so the
page holds on any machine; where the "real FP8" GEMMs fell back to emulation (no FP8 tensor cores, or a
CPU smoke run) it says so instead of presenting the fit as a hardware measurement.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["gpu_summary"]


def gpu_summary(result: Mapping) -> str:
    """``summary.md`` for a ``gpu.json`` written by ``bench/gpu.py``."""
    grids = result["grids_equal_cpu"]
    bad = sorted(g for g, ok in grids.items() if not ok)
    learner = result["learner"]
    real = bool(learner.get("real_fp8_on_tensor_cores"))
    lines = [f"# GPU benchmark — {result['device']} (torch {result['torch']})", ""]
    lines += ["## Grids on the device vs CPU bytes", "",
              f"{len(grids) - len(bad)} of {len(grids)} grid modes give the CPU reference's bytes on the device"
              + (f"; **differ: {', '.join(bad)}**." if bad else "."), ""]
    lines += ["## Learner GEMM layers per micro-batch (ratio to BF16 at the same tokens)", "",
              "Real FP8: " + ("block-scaled FP8 on tensor cores (Hopper FP8 in place of Blackwell MXFP8)." if real
                              else "**not on FP8 tensor cores here** — the `fp8-block-real` rows fell back to emulation."),
              "", "| tokens | " + " | ".join(v for v in ("bf16", "mxfp8-emulated", "fp8-block-real")) + " |",
              "|---:|---:|---:|---:|"]
    by = {}
    for r in learner["rows"]:
        by.setdefault(r["tokens"], {})[r["variant"]] = r
    for tokens in sorted(by):
        row = by[tokens]
        cells = [f"{row[v]['seconds'] * 1e3:.2f} ms (×{row[v]['vs_bf16']:.2f})" if v in row else "–"
                 for v in ("bf16", "mxfp8-emulated", "fp8-block-real")]
        lines.append(f"| {tokens} | " + " | ".join(cells) + " |")
    lines += ["", "## Cost model (fixed cost per micro-batch, per-token saving, break-even)", ""]
    for c in result["cost_model"]:
        label = c["label"] if (real or c["candidate"] != "fp8-block-real") else f"{c['candidate']} (emulated fallback)"
        lines.append(f"- **{label}**: {c['headline']}")
    fp = result["fingerprint"]
    lines += ["", "## Fingerprint vs a device copy", "",
              f"`{fp['fingerprint_fn']}` over {fp['mb']} MB: {fp['fingerprint_gb_s']:.2f} GB/s; a device copy of the "
              f"same bytes {fp['copy_gb_s']:.2f} GB/s (fingerprint time / copy time = {fp['fingerprint_vs_copy']:.2f}).", ""]
    fd = result.get("fingerprints_on_device")
    if fd:
        same = sum(fd["equal"].values())
        lines += ["## The checks' fingerprints on the device", "",
                  f"`{fd['fn']}` on the device equals the CPU's for {same} of {len(fd['equal'])} tensors; one byte "
                  f"flipped on the device {'changes' if fd['flip_changes_it'] else '**does not change**'} it.", ""]
    ex = result.get("export_slicing")
    if ex:
        lines += ["## The GPU export on the device (bytes, and the cut of TE's padded scales)", "",
                  "| shape | TE's padded scales | bytes = CPU | cut = compact scales | cut ms | buffer copy ms |",
                  "|---|---|---|---|---:|---:|"]
        for r in ex["rows"]:
            lines.append(f"| {tuple(r['shape'])} | {tuple(r['padded'])} | {'yes' if r['bytes_equal_cpu'] else '**no**'} | "
                         f"{'yes' if r['cut_equal'] and r['on_device'] else '**no**'} | {r['cut_ms']:.3f} | "
                         f"{r['copy_ms']:.3f} |")
        lines.append("")
    lines += [f"Figures: {', '.join(f'![{p}]({p})' for p in result.get('plots', []))}", "",
              f"Measured in {result.get('seconds', float('nan')):.0f} s by `bench/gpu.py`.", ""]
    return "\n".join(lines)
