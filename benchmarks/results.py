"""The committed results of ``make bench``: ``bench_results/<device>.jsonl`` (one JSON line per case) and
``bench_results/<device>.png`` (fraction of the copy roofline per case, ours beside each peer)."""

from __future__ import annotations

import json
import os

from benchmarks.harness import RESULTS_DIR


def merge_records(path: str, records: list[dict]) -> list[dict]:
    """The file's records with those of the operators in ``records`` replaced (a run of some operators
    keeps the others' lines), in operator order of first appearance."""
    ran = {r["op"] for r in records}
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            kept = [r for r in map(json.loads, filter(str.strip, f)) if r["op"] not in ran]
    merged = kept + records
    order = list(dict.fromkeys(r["op"] for r in merged))
    return sorted(merged, key=lambda r: order.index(r["op"]))


def write_jsonl(path: str, records: list[dict]) -> None:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def plot(records: list[dict], png: str) -> bool:
    """A horizontal bar per case and peer: fraction of the copy roofline (False: no matplotlib here)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written")
        return False
    rows = [r for r in records if r.get("roofline") is not None]
    if not rows:
        return False
    peers = sorted({p for r in rows for p, v in r["peers"].items() if v.get("roofline") is not None})
    series = ["ours"] + peers
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.28 * len(rows) * min(len(series), 4)))
    labels = [f"{r['op']} {r['case']}" for r in rows]
    for s, name in enumerate(series):
        vals = [r["roofline"] if name == "ours" else (r["peers"].get(name) or {}).get("roofline")
                for r in rows]
        ys = [i + s * height for i, v in enumerate(vals) if v is not None]
        ax.barh(ys, [v for v in vals if v is not None], height=height, label=name)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))], labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("fraction of the device-to-device copy roofline (higher is better)")
    r0 = rows[0]
    ax.set_title(f"{r0['device']}, commit {r0['commit']}, {r0['date']}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True


def save(records: list[dict], device: str) -> str:
    """Merge ``records`` into ``bench_results/<device>.jsonl`` and redraw its plot; returns the jsonl path."""
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{device}.jsonl")
    merged = merge_records(path, records)
    write_jsonl(path, merged)
    plot(merged, os.path.join(RESULTS_DIR, f"{device}.png"))
    return path
