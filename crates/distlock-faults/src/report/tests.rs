//! A page rendered from a small history with a stale write accepted: self-contained, and its
//! verdicts linked to the operations on the timeline.

use serde_json::{Value, json};

use super::*;
use crate::check::{self, Bounds};
use crate::resource::Register;

const MS: i64 = 1_000_000;

/// Forty operations of four workers, 100 ms apart; op 20 is paused between its read and its
/// write, which a broken resource accepts after op 23's.
fn history() -> (Vec<Value>, Register) {
    let mut fenced = Register::default();
    let mut ev = vec![json!({"ev": "start", "t": 0, "ttl_ms": 500})];
    let mut late = None;
    for n in 1..=40u64 {
        let w = n % 4;
        let t = n as i64 * 100 * MS;
        let op = |ev: &mut Vec<Value>, e: Value| ev.push(e);
        op(
            &mut ev,
            json!({"ev": "invoke", "f": "acquire", "n": n, "w": w, "t": t}),
        );
        op(
            &mut ev,
            json!({"ev": "ok", "f": "acquire", "n": n, "w": w, "t": t + 5 * MS,
            "fence": n, "vu": t + 500 * MS, "validity_ms": 495}),
        );
        let value = fenced.read(true, Some(n));
        op(
            &mut ev,
            json!({"ev": "read", "n": n, "w": w, "t": t + 10 * MS,
            "sent": t + 9 * MS, "key": "k", "fence": n, "value": value, "uvalue": value}),
        );
        if n == 20 {
            late = Some(value);
            ev.push(
                json!({"ev": "fault", "kind": "pause-holder", "w": w, "holder": n,
                "start": t + 20 * MS, "end": t + 350 * MS, "t": t + 350 * MS,
                "server_side": false}),
            );
            continue;
        }
        if n == 23 {
            let v = late.unwrap_or(0) + 1;
            // Refused by the register, recorded accepted: the resource's bug.
            let _ = fenced.write(true, 20, Some(20), v);
            ev.push(json!({"ev": "write", "n": 20, "w": 0, "t": t + 60 * MS,
                "sent": t + 59 * MS, "key": "k", "fence": 20, "value": v, "accepted": true,
                "uaccepted": true}));
            ev.push(json!({"ev": "invoke", "f": "release", "n": 20, "w": 0,
                "t": t + 61 * MS}));
        }
        let accepted = fenced.write(true, n, Some(n), value + 1);
        op(
            &mut ev,
            json!({"ev": "write", "n": n, "w": w, "t": t + 40 * MS,
            "sent": t + 39 * MS, "key": "k", "fence": n, "value": value + 1,
            "accepted": accepted, "uaccepted": true}),
        );
        op(
            &mut ev,
            json!({"ev": "invoke", "f": "release", "n": n, "w": w, "t": t + 50 * MS}),
        );
        op(
            &mut ev,
            json!({"ev": "ok", "f": "release", "n": n, "w": w, "t": t + 52 * MS,
            "held": true}),
        );
    }
    ev.push(json!({"ev": "end", "t": 4200 * MS}));
    ev.sort_by_key(|e| e["t"].as_i64());
    (ev, fenced)
}

fn figures(events: &[Value], fenced: &Register) -> Figures {
    let bounds = Bounds {
        free_within_ns: 3000 * MS,
        detect_within_ns: 500 * MS,
        caveat_window_ns: 1000 * MS,
        split_brain: false,
    };
    let mut f = check::check(
        events,
        Some(fenced),
        &Register::default(),
        bounds,
        4200 * MS,
    );
    f.set_linear(crate::linear::check_history(events, true));
    f
}

#[test]
fn a_page_is_self_contained_and_links_each_verdict_to_its_operation() {
    let (events, fenced) = history();
    let f = figures(&events, &fenced);
    assert!(f.ck1 > 0, "{:?}", f.examples);
    assert_eq!(f.linear.as_ref().map(|v| v.violations()), Some(1));
    let page = Page {
        scenario: "sample",
        about: "a stale write <accepted>",
        seed: 7,
        bug: None,
        line: "sample: a line",
    };
    let html = render(&page, &events, &f);
    if let Ok(path) = std::env::var("DISTLOCK_REPORT_SAMPLE") {
        std::fs::write(path, &html).expect("the sample page");
    }
    // Nothing from outside: no script, stylesheet, font or image to fetch.
    for bad in ["<script", "<link", "<img", "@import", "url(", "https://"] {
        assert!(!html.contains(bad), "{bad}");
    }
    assert_eq!(
        html.matches("http://").count(),
        html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count()
    );
    assert!(html.contains("a stale write &lt;accepted&gt;"));
    // Each link has its anchor; the first offenders of CK1 and of the linearizability check
    // are op 20, outlined.
    for (at, _) in html.match_indices("href=\"#op-") {
        let n: String = html[at + 10..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        assert_eq!(html.matches(&format!("id=\"op-{n}\"")).count(), 1, "op {n}");
    }
    let lin = html
        .lines()
        .find(|l| l.starts_with("<tr><td>LIN</td>"))
        .expect("the LIN row");
    assert!(
        lin.contains("FAIL: 1") && lin.contains("href=\"#op-20\""),
        "{lin}"
    );
    assert!(html.contains("first offending operation of CK1, LIN"));
    assert!(html.contains("class=\"flag\""));
    assert!(html.contains("VIOLATIONS"));
}

#[test]
fn the_index_links_each_scenario_page() {
    let html = index(&[
        ("a".into(), true, "a: fine".into(), "a-1.html".into()),
        ("b".into(), false, "b: <bad>".into(), "b-1.html".into()),
    ]);
    assert!(html.contains("<a href=\"a-1.html\">a</a>"));
    assert!(html.contains("VIOLATIONS") && html.contains("b: &lt;bad&gt;"));
}

#[test]
fn the_plots_are_one_standalone_image() {
    let (events, fenced) = history();
    let f = figures(&events, &fenced);
    let page = Page {
        scenario: "sample",
        about: "",
        seed: 7,
        bug: None,
        line: "sample: <a line>",
    };
    let svg = plots_svg(&page, &events, &f);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    // Its own styles, the two plots nested and placed one under the other, every element
    // closed, nothing fetched.
    assert!(svg.contains("<style>") && svg.contains(".pane{"));
    assert_eq!(svg.matches("<svg").count(), 3);
    assert_eq!(svg.matches("</svg>").count(), 3);
    assert!(svg.contains("<svg y=\"28\" class=\"plot\""));
    for bad in ["<script", "<img", "url(", "https://"] {
        assert!(!svg.contains(bad), "{bad}");
    }
    assert!(svg.contains("sample: &lt;a line&gt;"));
}
