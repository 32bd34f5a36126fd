"""The qualification report as one self-contained HTML page: no script, no external resource."""
from __future__ import annotations

from html import escape

from ..measure.throughput import StrategyThroughput
from .lost_work import lost_line, per_strategy
from .qualification import FAILING, CaseRecord, Qualification, summary
from .svg import Series, loss_plot

STYLE = """
body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1300px}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;
vertical-align:top;font-size:13px}th{background:#f3f3f3}
.passed{background:#d9f2d9}.xfailed{background:#fff0c2}.failed,.error{background:#f8d0d0}.skipped{background:#e6e6e6}
.cell a{display:block;text-decoration:none;color:inherit;padding:1px 0}
code,pre{font-size:12px}pre{background:#f7f7f7;padding:6px;overflow-x:auto;white-space:pre-wrap}
section.case{border-top:1px solid #bbb;margin-top:1.2em;padding-top:.4em}
.figures{display:flex;gap:1.5em;flex-wrap:wrap;align-items:flex-start}
details{margin:.3em 0}summary{cursor:pointer}
"""
COLORS = {"reference": "#1f77b4", "first run": "#ff7f0e", "restored": "#2ca02c"}


def _anchor(record: CaseRecord) -> str:
    return "case-" + "".join(c if c.isalnum() else "-" for c in record.label)


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _mb(value: float) -> str:
    return f"{value / 1e6:.1f} MB/s"


def render_matrix(cases: tuple[CaseRecord, ...]) -> str:
    strategies = list(dict.fromkeys(c.strategy for c in cases))
    faults = list(dict.fromkeys(c.fault.split(" ", 1)[0] for c in cases))
    cells: dict[tuple[str, str], list[CaseRecord]] = {}
    for case in cases:
        cells.setdefault((case.strategy, case.fault.split(" ", 1)[0]), []).append(case)
    rows = ['<table id="verdict-matrix" class="matrix"><tr><th>strategy \\ fault</th>'
            + "".join(f"<th>{escape(f)}</th>" for f in faults) + "</tr>"]
    for strategy in strategies:
        row = [f"<tr><th>{escape(strategy)}</th>"]
        for fault in faults:
            entries = cells.get((strategy, fault), [])
            links = "".join(
                f'<a class="{c.status}" href="#{_anchor(c)}" title="{escape(c.name)}: {escape(c.fault)}">'
                f'{escape(c.verdict or c.status.upper())}{" ✗" if c.status in FAILING else ""}'
                f'{_intact_mark(c)}</a>' for c in entries)
            row.append(f'<td class="cell">{links or "&nbsp;"}</td>')
        rows.append("".join(row) + "</tr>")
    rows.append("</table>")
    return "".join(rows)


def _intact_mark(record: CaseRecord) -> str:
    if record.intact_step is None:
        return ""
    return f' <span class="intact" title="refused; step {record.intact_step} was intact and never tried">⚠</span>'


def _throughput_plot(figures: tuple[StrategyThroughput, ...]) -> str:
    """Horizontal bars: save and restore throughput as a fraction of the raw write+fsync probe."""
    bar_h, label_w, plot_w = 12, 250, 300
    top = max([1.0] + [max(f.save_fraction, f.restore_fraction) for f in figures])
    height = 26 + len(figures) * (2 * bar_h + 10)
    parts = [f'<svg class="plot" id="throughput-plot" role="img" xmlns="http://www.w3.org/2000/svg" '
             f'width="{label_w + plot_w + 70}" height="{height}"><title>throughput as a fraction of raw bandwidth'
             f'</title>']
    x_one = label_w + plot_w / top
    parts.append(f'<line x1="{x_one:.1f}" y1="4" x2="{x_one:.1f}" y2="{height - 16}" stroke="#999" '
                 f'stroke-dasharray="3,3"/><text x="{x_one:.1f}" y="{height - 4}" font-size="10" '
                 f'text-anchor="middle">raw = 1.0</text>')
    y = 6
    for figure in figures:
        parts.append(f'<text x="{label_w - 6}" y="{y + bar_h + 4}" font-size="11" text-anchor="end">'
                     f'{escape(figure.strategy)}</text>')
        for value, color, what in ((figure.save_fraction, "#ff7f0e", "save"),
                                   (figure.restore_fraction, "#2ca02c", "restore")):
            width = plot_w * value / top
            parts.append(f'<rect x="{label_w}" y="{y}" width="{width:.1f}" height="{bar_h}" fill="{color}">'
                         f'<title>{escape(figure.strategy)} {what}: {value:.2f} of raw</title></rect>'
                         f'<text x="{label_w + width + 4:.1f}" y="{y + bar_h - 2}" font-size="10">{what} {value:.2f}'
                         f'</text>')
            y += bar_h
        y += 10
    parts.append("</svg>")
    return "".join(parts)


def render_object_store(report: Qualification) -> list[str]:
    """The store's rows: endpoint, bucket, prefix, what the server calls itself, PUT and GET."""
    store, b = report.environment.object_store, report.object_bandwidth
    parts = ["<h2>Checkpoint object store</h2><table>",
             f"<tr><th>endpoint</th><td><code>{escape(store.endpoint)}</code></td></tr>",
             f"<tr><th>bucket / prefix</th><td><code>{escape(store.bucket)}</code> / "
             f"<code>{escape(store.prefix)}</code></td></tr>",
             f"<tr><th>server</th><td>{escape(store.server or 'did not say')}</td></tr>"]
    if b:
        parts.append(f"<tr><th>raw PUT (one object)</th><td id=\"raw-put\">{_mb(b.put_bytes_per_s)} "
                     f"({b.size_bytes >> 20} MiB in {b.put_s:.2f} s)</td></tr>"
                     f"<tr><th>raw GET (the same object)</th><td id=\"raw-get\">{_mb(b.get_bytes_per_s)} "
                     f"({b.size_bytes >> 20} MiB in {b.get_s:.2f} s)</td></tr>")
    return parts


def render_filesystem(report: Qualification) -> str:
    env = report.environment
    mount = env.mount
    if env.object_store:
        parts = render_object_store(report)
        mount = None
    else:
        parts = ["<h2>Checkpoint filesystem</h2><table>",
                 f"<tr><th>checkpoint directory</th><td><code>{escape(env.checkpoint_dir)}</code></td></tr>"]
    if env.object_store:
        pass
    elif mount:
        parts += [f"<tr><th>filesystem type</th><td>{escape(mount.fs_type)}</td></tr>",
                  f"<tr><th>mount point</th><td><code>{escape(mount.mount_point)}</code> "
                  f"(source <code>{escape(mount.source)}</code>)</td></tr>",
                  f"<tr><th>mount options</th><td><code>{escape(mount.options)}</code></td></tr>"]
    else:
        parts.append("<tr><th>mount</th><td>not found in /proc/self/mountinfo</td></tr>")
    if report.bandwidth:
        b = report.bandwidth
        parts.append(f"<tr><th>raw sequential write + fsync</th><td id=\"raw-bandwidth\">{_mb(b.bytes_per_s)} "
                     f"({b.size_bytes >> 20} MiB in {b.seconds:.2f} s)</td></tr>")
    parts.append("</table>")
    if report.throughput:
        parts.append("<h3>Save and restore throughput, as a fraction of the raw probe (same run)</h3>"
                     "<table id=\"throughput\"><tr><th>strategy</th><th>world size</th><th>bytes per checkpoint</th>"
                     "<th>save</th><th>save / raw</th><th>restore</th><th>restore / raw</th><th>verdict</th></tr>")
        for f in report.throughput:
            parts.append(f"<tr><td>{escape(f.strategy)}</td><td>{f.world_size}</td>"
                         f"<td>{f.bytes_per_checkpoint >> 20} MiB</td><td>{_mb(f.save_bytes_per_s)} in "
                         f"{f.save_s:.2f} s</td><td>{f.save_fraction:.2f}</td><td>{_mb(f.restore_bytes_per_s)} in "
                         f"{f.restore_s:.2f} s</td><td>{f.restore_fraction:.2f}</td><td>{escape(f.verdict)}</td></tr>")
        parts.append("</table>" + _throughput_plot(report.throughput))
        if env.object_store:
            parts.append("<p>On the object store, raw is the probe's PUT for the save and its GET for the "
                         "restore; bytes per checkpoint are what the bucket held under the case's prefix.</p>")
        parts.append("<p>Save: checkpoint bytes over the time from the first rank entering the save to the "
                     "last rank returning from it. Restore: the same bytes over the restart's slowest "
                     "<code>strategy.load</code>; a restore right after a save reads mostly from the page "
                     "cache, so it can exceed the raw write figure. A save above 1.0 returned before its bytes "
                     "were on disk (no fsync): a machine crash right after it can lose a checkpoint reported "
                     "saved.</p>")
    for note in report.notes:
        parts.append(f"<p class=\"note\">{escape(note)}</p>")
    return "".join(parts)


def render_lost_work(report: Qualification) -> str:
    rows = per_strategy(report.cases)
    if not rows:
        return ""
    parts = ["<h2>Lost work per strategy</h2><table id=\"lost-work\"><tr><th>strategy</th><th>cases</th>"
             "<th>restored</th><th>steps lost</th><th>seconds lost</th><th>of which restart</th>"
             "<th>of which replay</th><th>time to restore</th><th>refused with an intact older checkpoint</th></tr>"]
    for row in rows:
        parts.append(f"<tr><td>{escape(row.strategy)}</td><td>{row.cases}</td><td>{row.restored}</td>"
                     f"<td>{row.steps_lost}</td><td>{_fmt_s(row.lost_s)}</td><td>{_fmt_s(row.restart_s)}</td>"
                     f"<td>{_fmt_s(row.replay_s)}</td><td>{_fmt_s(row.restore_s)}</td>"
                     f"<td>{row.refused_with_intact}</td></tr>")
    parts.append("</table><p>Steps lost: steps the first run had trained that the restart trained again. Seconds "
                 "lost: restart (first rank joining the group to the last rank restored) plus replay (from there "
                 "to the last rank's loss at the first run's last step), summed over the strategy's cases.</p>")
    return "".join(parts)


def render_environment(report: Qualification) -> str:
    env = report.environment
    rows = [("python", env.python)] + [(name, version or "not installed") for name, version in env.libraries.items()]
    rows += [("kernel", env.kernel), ("machine", f"{env.machine}, {env.cpus} CPUs"), ("launcher", report.launcher)]
    return ("<h2>Environment</h2><table id=\"environment\">"
            + "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows) + "</table>")


def render_case(record: CaseRecord) -> str:
    parts = [f'<section class="case" id="{_anchor(record)}"><h3 class="{record.status}">'
             f'{escape(record.status.upper())}: {escape(record.name)}</h3>',
             f"<p><code>{escape(record.label)}</code></p><table>",
             f"<tr><th>strategy</th><td>{escape(record.strategy)}</td></tr>",
             f"<tr><th>fault</th><td>{escape(record.fault)}</td></tr>",
             f"<tr><th>verdict</th><td>{escape(record.verdict or '-')} (expected {escape(record.expected)})</td></tr>"]
    if record.reason:
        parts.append(f"<tr><th>why</th><td>{escape(record.reason)}</td></tr>")
    parts += [f"<tr><th>restored step</th><td>{record.restored_step if record.restored_step is not None else '-'}"
              " (newest checkpoint saved on every rank: "
              f"{record.complete_step if record.complete_step is not None else '-'})</td></tr>",
              f"<tr><th>steps lost</th><td>{record.steps_lost if record.steps_lost is not None else '-'}</td></tr>",
              *([f"<tr><th>restored from</th><td>{escape(record.restored_from)} ({record.storage_bytes_read} bytes "
                 "read from storage)</td></tr>"] if record.restored_from is not None else []),
              "<tr><th>work lost</th><td class=\"lost-work\">"
              f"{escape(lost_line(record.steps_lost, record.restart_s, record.replay_s))}</td></tr>",
              f"<tr><th>time to restore</th><td>{_fmt_s(record.restore_s)}</td></tr>",
              f"<tr><th>save times</th><td>{', '.join(f'step {s}: {t:.2f} s' for s, t in record.save_s) or '-'}"
              f"</td></tr>",
              f"<tr><th>case time</th><td>{record.elapsed_s:.1f} s</td></tr>",
              f"<tr><th>replay</th><td><code class=\"replay\">{escape(record.replay)}</code></td></tr></table>"]
    if record.findings:
        parts.append("<ul>" + "".join(f"<li>{escape(f)}</li>" for f in record.findings) + "</ul>")
    if record.reference_losses or record.restored_losses:
        parts.append('<div class="figures">' + loss_plot(f"loss: {record.label}", [
            Series("reference", record.reference_losses, COLORS["reference"]),
            Series("first run", record.first_run_losses, COLORS["first run"], dashed=True),
            Series("restored", record.restored_losses, COLORS["restored"])],
            marker_step=record.restored_step) + "</div>")
    for log in record.logs:
        if not (log.stderr_tail.strip() or log.stdout_tail.strip()):
            continue
        parts.append(f"<details class=\"rank-log\"><summary>{escape(log.phase)} rank {log.rank} log "
                     f"(exit {log.returncode})</summary>"
                     + (f"<pre>{escape(log.stderr_tail)}</pre>" if log.stderr_tail.strip() else "")
                     + (f"<pre>{escape(log.stdout_tail)}</pre>" if log.stdout_tail.strip() else "") + "</details>")
    parts.append("</section>")
    return "".join(parts)


def render(report: Qualification) -> str:
    counts = summary(report.cases)
    headline = ", ".join(f"{v} {k}" for k, v in counts.items() if k != "total")
    verdict = "FAILED" if report.failed else "PASSED"
    return "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>resilience qualification: {verdict}</title><style>{STYLE}</style></head><body>",
        "<h1>Checkpoint resilience qualification: "
        f"<span id=\"overall\" class=\"{'failed' if report.failed else 'passed'}\">{verdict}</span></h1>",
        f"<p>{counts['total']} cases: {escape(headline)}. Started {escape(report.started)}, "
        f"{report.elapsed_s:.0f} s. Command: <code>{escape(report.command)}</code></p>",
        "<h2>Verdict matrix</h2>", render_matrix(report.cases),
        "<p>Each cell links to its case; ✗ marks a case whose verdict is not the one its scenario expects; "
        "⚠ marks a refused restore that left an intact older checkpoint unused.</p>",
        render_lost_work(report), render_environment(report), render_filesystem(report),
        "<h2>Cases</h2>", "".join(render_case(c) for c in report.cases),
        "</body></html>"])
