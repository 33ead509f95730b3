//! `report.html`: the run as a reader can check it, in one self-contained file (inline SVG and
//! CSS, no script, no external font or image): the checkers' verdicts, each linked to its first
//! offending operation; latency and throughput with the faults shaded; and a timeline per
//! worker of every acquire, hold and release, with refused stale writes marked and the faults
//! as bands. Tooltips are SVG `<title>`s, which browsers show without any script.

mod history;
mod plots;
mod svg;
mod timeline;
mod verdicts;

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use self::svg::esc;
use crate::check::Figures;

/// What the page says about the run besides its history and figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Page<'a> {
    pub(crate) scenario: &'a str,
    pub(crate) about: &'a str,
    pub(crate) seed: u64,
    /// The seeded bug of a negative control.
    pub(crate) bug: Option<&'a str>,
    /// The scenario's line, as the harness printed it.
    pub(crate) line: &'a str,
}

/// The history file's events.
pub(crate) fn load(history: &Path) -> Result<Vec<Value>, String> {
    let text =
        std::fs::read_to_string(history).map_err(|e| format!("{}: {e}", history.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

const CSS: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222;max-width:1340px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #ddd}
.line{font-family:monospace;font-size:12px;background:#f6f6f6;padding:6px 8px;white-space:pre-wrap}
.about{color:#555;margin:0}.note,.cap{color:#555;font-size:12px;margin:2px 0 10px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
td.pass{background:#e8f5e9}td.fail{background:#ffcdd2;font-weight:bold}td.unknown{background:#fff3cd}td.na{color:#888}td.d{color:#555;font-size:12px}
.ok{color:#2e7d32;font-weight:bold}.bad{color:#c62828;font-weight:bold}
ul.ex{font-family:monospace;font-size:12px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}.legend i{display:inline-block;width:18px;height:10px;margin-right:4px;vertical-align:middle;border:1px solid #999}
svg{display:block;margin:2px 0}
.lane0{fill:#fafafa}.lane1{fill:#f0f0f0}.grid{stroke:#ddd;stroke-width:1}.tick{font:10px sans-serif;fill:#555}.lbl{font:11px sans-serif;fill:#333}
.fl{font:10px sans-serif;fill:#4e342e}.pane{fill:#fff;stroke:#ccc}
.a-ok{fill:#b0bec5}.a-fail{fill:#e57373}.a-info{fill:#ffb74d}.a-open{fill:#e0e0e0}
.h-acc{fill:#43a047}.h-ref{fill:#fb8c00}.h-read{fill:#42a5f5}.h-lost{fill:#9575cd}.h-end{stroke:#3e2723;stroke-width:1;stroke-dasharray:3 2}
.r-ok{fill:#546e7a}.r-fail{fill:#e53935}.r-info{fill:#ff9800}.r-open{fill:#bdbdbd}
.rd{stroke:#0d47a1;stroke-width:1.2}.wr{stroke:#1b5e20;stroke-width:2}.stale{stroke:#b71c1c;stroke-width:2.4;fill:none}.lost{fill:#000}
.flag{fill:none;stroke:#d50000;stroke-width:2;stroke-dasharray:4 2}
.fw{fill:rgba(255,214,0,.45)}g.wf{pointer-events:none}g.wf .fw{fill:rgba(255,214,0,.35);stroke:#c6a700;stroke-width:1}.fa{fill:rgba(121,134,203,.22)}.fs{fill:rgba(229,57,53,.18)}
g.op:target rect{stroke:#000;stroke-width:2}g.op:target .flag{stroke:#d50000;stroke-width:3}
.pt-ok{fill:#43a047;fill-opacity:.7}.pt-fail{fill:#e53935}.pt-info{fill:#fb8c00}.pt-rel{fill:#9e9e9e;fill-opacity:.6}
.bar{fill:#90caf9}.bar-ref{fill:#e53935}.line-acc{fill:none;stroke:#2e7d32;stroke-width:1.5}
";

const LEGEND: &str = r#"<div class="legend">
<span><i style="background:#b0bec5"></i>acquire (wait)</span><span><i style="background:#e57373"></i>acquire failed</span><span><i style="background:#ffb74d"></i>acquire unknown</span>
<span><i style="background:#43a047"></i>hold, write accepted</span><span><i style="background:#fb8c00"></i>hold, write refused (<b style="color:#b71c1c">&#x2715;</b> stale write turned away)</span>
<span><i style="background:#42a5f5"></i>hold, read only</span><span><i style="background:#9575cd"></i>hold, lease lost or not held at its check (&#9660; lost signal)</span>
<span><i style="background:#fff;border:1px dashed #3e2723"></i>ended by abandon, cancel or kill</span><span><i style="background:#546e7a"></i>release</span>
<span>ticks: <b style="color:#0d47a1">|</b> read (top), <b style="color:#1b5e20">|</b> accepted write (bottom)</span><br>
<span><i style="background:rgba(255,214,0,.45)"></i>fault of one worker (over its lane)</span><span><i style="background:rgba(121,134,203,.22)"></i>fault of links or servers</span><span><i style="background:rgba(229,57,53,.18)"></i>server-side fault (breaks leases on purpose)</span>
<span><i style="background:#fff;border:2px dashed #d50000"></i>first offending operation of a check</span>
</div>"#;

/// The page.
pub(crate) fn render(page: &Page, events: &[Value], f: &Figures) -> String {
    let run = history::view(events, f.fenced.is_some());
    let rows = verdicts::rows(f);
    let mut flagged: HashMap<u64, Vec<String>> = HashMap::new();
    for r in &rows {
        if let Some(n) = r.first {
            flagged.entry(n).or_default().push(r.id.to_owned());
        }
    }
    let anchored: HashSet<u64> = run.ops.iter().map(|o| o.n).collect();
    let failed = rows.iter().any(|r| r.count.is_some_and(|c| c > 0));
    let title = match page.bug {
        Some(b) => format!("{} with seeded bug {b}, seed {}", page.scenario, page.seed),
        None => format!("{}, seed {}", page.scenario, page.seed),
    };
    let mut out = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{CSS}</style></head><body>\n",
        esc(&title)
    );
    let _ = writeln!(
        out,
        "<h1>{} — {}</h1><p class=\"about\">{}</p><p>{:.1} s, {} workers, {} operations, faults: {}.</p><p class=\"line\">{}</p>",
        esc(&title),
        if failed {
            "<span class=\"bad\">VIOLATIONS</span>"
        } else {
            "<span class=\"ok\">no violation</span>"
        },
        esc(page.about),
        run.length,
        run.workers,
        run.ops.len(),
        run.faults.len(),
        esc(page.line)
    );
    out.push_str("<h2>Verdicts</h2>\n");
    out.push_str(&verdicts::table(&rows, &anchored));
    if !f.examples.is_empty() {
        out.push_str("<ul class=\"ex\">");
        for e in &f.examples {
            let _ = write!(out, "<li>{}</li>", esc(e));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("<h2>Latency and throughput</h2>\n");
    for (svg, caption) in [plots::latency(&run), plots::throughput(&run)] {
        out.push_str(&svg);
        let _ = writeln!(out, "<p class=\"cap\">{}</p>", esc(&caption));
    }
    let _ = writeln!(
        out,
        "<h2>Timeline</h2><p class=\"note\">A lane per worker, in strips of {} s. Hover for an operation's details.</p>",
        svg::trim(timeline::strip_len(&run))
    );
    out.push_str(LEGEND);
    out.push_str(&timeline::timeline(&run, &flagged));
    out.push_str(&faults_table(&run, &anchored));
    out.push_str("</body></html>\n");
    out
}

fn faults_table(run: &history::RunView, anchored: &HashSet<u64>) -> String {
    let mut out = String::from("<h2>Faults</h2>\n");
    if run.faults.is_empty() {
        out.push_str("<p>None.</p>\n");
        return out;
    }
    out.push_str("<table><tr><th>fault</th><th>from</th><th>for</th><th>worker</th><th>holder</th><th>server-side</th></tr>\n");
    for fv in &run.faults {
        let holder = match fv.holder {
            Some(n) if anchored.contains(&n) => format!(r##"<a href="#op-{n}">op {n}</a>"##),
            Some(n) => format!("op {n}"),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{:.3} s</td><td>{:.0} ms</td><td>{}</td><td>{holder}</td><td>{}</td></tr>",
            esc(&fv.kind),
            fv.start,
            (fv.end - fv.start) * 1e3,
            fv.worker.map(|w| w.to_string()).unwrap_or_default(),
            if fv.server_side { "yes" } else { "" }
        );
    }
    out.push_str("</table>\n");
    out
}

/// The two plots (latency, throughput) with their captions, as one standalone SVG image with
/// its own styles: what a document shows of a run (`docs/reliability.md`).
pub(crate) fn plots_svg(page: &Page, events: &[Value], f: &Figures) -> String {
    let run = history::view(events, f.fenced.is_some());
    let width = 1320;
    let mut body = String::new();
    let mut y = 28;
    for (svg, caption) in [plots::latency(&run), plots::throughput(&run)] {
        let height = svg
            .split_once("height=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .and_then(|(h, _)| h.parse::<u32>().ok())
            .unwrap_or(200);
        // The plot as a nested `svg`, placed by its `y`.
        let _ = write!(
            body,
            "{}",
            svg.replacen("<svg ", &format!("<svg y=\"{y}\" "), 1)
        );
        y += height + 14;
        let _ = write!(
            body,
            "<text class=\"cap\" x=\"8\" y=\"{}\">{}</text>",
            y - 4,
            esc(&caption)
        );
        y += 10;
    }
    let title = format!("{}, seed {}: {}", page.scenario, page.seed, page.line);
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{y}\" viewBox=\"0 0 {width} {y}\"><style>{CSS}.cap{{font:11px sans-serif;fill:#555}}.ttl{{font:bold 12px sans-serif;fill:#222}}</style><rect width=\"100%\" height=\"100%\" fill=\"#fff\"/><text class=\"ttl\" x=\"8\" y=\"16\">{}</text>{body}</svg>\n",
        esc(&title.chars().take(200).collect::<String>())
    )
}

/// Writes the page to `path`, and its plots beside it (`<name>-plots.svg`).
pub(crate) fn write_page(
    path: &Path,
    page: &Page,
    events: &[Value],
    f: &Figures,
) -> Result<(), String> {
    std::fs::write(path, render(page, events, f))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let plots = path.with_file_name(format!("{stem}-plots.svg"));
    std::fs::write(&plots, plots_svg(page, events, f))
        .map_err(|e| format!("{}: {e}", plots.display()))
}

/// An index of several scenarios' pages: (scenario, passed, its line, its page's file name).
pub(crate) fn index(entries: &[(String, bool, String, String)]) -> String {
    let mut out = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>distlock-faults: {} scenarios</title><style>{CSS}</style></head><body>\n<h1>distlock-faults: {} scenarios</h1>\n<table><tr><th>scenario</th><th>verdict</th><th>line</th></tr>\n",
        entries.len(),
        entries.len()
    );
    for (name, ok, line, file) in entries {
        let _ = writeln!(
            out,
            "<tr><td><a href=\"{}\">{}</a></td><td class=\"{}\">{}</td><td class=\"d\">{}</td></tr>",
            esc(file),
            esc(name),
            if *ok { "pass" } else { "fail" },
            if *ok { "no violation" } else { "VIOLATIONS" },
            esc(line)
        );
    }
    out.push_str("</table></body></html>\n");
    out
}

#[cfg(test)]
mod tests;
