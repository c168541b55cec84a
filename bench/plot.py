"""A bar chart of the benchmark's GB/s as a standalone SVG (no plotting library needed).

Left panel: per workload and dtype, the read limit, the CLI, numalign.judge in memory,
PyTorch's load + same() and same() alone (log scale: they differ by orders of magnitude).
Right panel: the kernel's single-thread GB/s per dtype, in cache and from memory.
"""

import math
from html import escape

SERIES = [("a_2t", "(a) read limit", "#7f7f7f"), ("b_2t", "(b) numalign CLI", "#1f77b4"),
          ("d_judge", "(d) numalign.judge", "#2ca02c"), ("c", "(c) load + same()", "#d62728"),
          ("d_same", "(d) same() only", "#ff9896")]
KERNEL = [("in cache", "#9467bd"), ("from memory", "#c5b0d5")]


def _log_y(value, lo, hi, top, height):
    value = min(max(value, lo), hi)
    return top + height * (1 - (math.log10(value) - math.log10(lo)) /
                           (math.log10(hi) - math.log10(lo)))


def _axis(parts, x0, x1, top, height, lo, hi, label):
    parts.append(f'<line x1="{x0}" y1="{top}" x2="{x0}" y2="{top + height}" stroke="black"/>')
    parts.append(f'<line x1="{x0}" y1="{top + height}" x2="{x1}" y2="{top + height}" '
                 'stroke="black"/>')
    decade = math.floor(math.log10(lo))
    while 10 ** decade <= hi:
        v = 10 ** decade
        if v >= lo:
            y = _log_y(v, lo, hi, top, height)
            parts.append(f'<line x1="{x0 - 4}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" '
                         'stroke="#ddd"/>')
            parts.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
        decade += 1
    parts.append(f'<text x="{x0 - 40}" y="{top + height / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 {x0 - 40} {top + height / 2})">{label}</text>')


def _bar(parts, x, width, value, lo, hi, top, height, color):
    y = _log_y(value, lo, hi, top, height)
    parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" '
                 f'height="{top + height - y:.1f}" fill="{color}"/>')
    parts.append(f'<text x="{x + width / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                 f'font-size="9">{value:.3g}</text>')


def _legend(parts, x, y, entries):
    for i, (name, color) in enumerate(entries):
        parts.append(f'<rect x="{x}" y="{y + 16 * i}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 14}" y="{y + 16 * i + 9}">{escape(name)}</text>')


def svg(results, kernels):
    groups = list(results.values())
    values = [g["derived"][k] for g in groups for k, _, _ in SERIES
              if g["derived"][k] is not None] + [k["gbps"] for k in kernels]
    lo = 10 ** math.floor(math.log10(max(min(values), 1e-4)))
    hi = 10 ** math.ceil(math.log10(max(values)))
    top, height, bar = 40, 300, 16
    left_w = 90 + len(groups) * (bar * len(SERIES) + 30)
    dtypes = list(dict.fromkeys(k["dtype"] for k in kernels))
    right_x = left_w + 80
    right_w = len(dtypes) * (bar * 2 + 24) + 20
    width, total_h = right_x + right_w + 20, top + height + 140
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" '
             'font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{total_h}" fill="white"/>',
             f'<text x="80" y="20" font-size="13">Judging traces: GB/s of the three inputs '
             '(2 threads)</text>',
             f'<text x="{right_x}" y="20" font-size="13">Kernel, 1 thread</text>']
    _axis(parts, 80, left_w, top, height, lo, hi, "GB/s (log)")
    x = 90
    for g in groups:
        for i, (key, _, color) in enumerate(SERIES):
            if g["derived"][key] is not None:  # same() has no fp8 arithmetic
                _bar(parts, x + i * bar, bar - 2, g["derived"][key], lo, hi, top, height, color)
        cx = x + bar * len(SERIES) / 2
        parts.append(f'<text x="{cx}" y="{top + height + 14}" text-anchor="middle">'
                     f'{escape(g["workload"])}</text>')
        parts.append(f'<text x="{cx}" y="{top + height + 27}" text-anchor="middle">'
                     f'{escape(g["dtype"])}</text>')
        x += bar * len(SERIES) + 30
    _legend(parts, 90, top + height + 40, [(n, c) for _, n, c in SERIES])
    _axis(parts, right_x, right_x + right_w, top, height, lo, hi, "GB/s (log)")
    sizes = sorted({k["elements"] for k in kernels})
    x = right_x + 10
    for dt in dtypes:
        for i, size in enumerate(sizes[:2]):
            rows = [k for k in kernels if k["dtype"] == dt and k["elements"] == size]
            if rows:
                _bar(parts, x + i * bar, bar - 2, rows[0]["gbps"], lo, hi, top, height,
                     KERNEL[i][1])
        parts.append(f'<text x="{x + bar}" y="{top + height + 14}" text-anchor="middle">'
                     f'{escape(dt)}</text>')
        x += bar * 2 + 24
    _legend(parts, right_x + 10, top + height + 40,
            [(f"{name} ({size} elements)", color)
             for (name, color), size in zip(KERNEL, sizes[:2])])
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
