//! `distlock list`: every lock held on an engine, with its holders and waiters.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;
use distlock::{LeaseKind, Listing, LockStatus};

use crate::{exit, when};

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// At most this many locks; the engine's scan stops about there too, in steps that never
    /// block the server.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    limit: usize,
    /// Print one JSON object: `locks` (each as `status --json` prints one, with its `name`),
    /// `more` (the scan stopped at --limit) and `at` (when, RFC 3339).
    #[arg(long, conflicts_with = "watch")]
    json: bool,
    /// Read again every --interval and redraw in place on a terminal, like watch(1), marking
    /// the rows that changed since the last read (+ new, ~ changed) and the locks that went.
    #[arg(long)]
    watch: bool,
    /// How often --watch reads.
    #[arg(long, default_value = "2s", value_parser = crate::parse_duration, value_name = "D")]
    interval: Duration,
    /// Only the locks whose names start with PREFIX.
    prefix: Option<String>,
}

pub(crate) async fn list(args: ListArgs) -> u8 {
    if args.limit == 0 {
        eprintln!("distlock: --limit must be at least 1");
        return exit::USAGE;
    }
    let client = match args.engine.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let prefix = args.prefix.as_deref().unwrap_or("");
    let mut last: Option<Seen> = None;
    loop {
        let listing = match client.list(prefix, args.limit).await {
            Ok(l) => l,
            Err(e) => return exit::report("cannot list the locks", &e),
        };
        let now = when::now_ms();
        if args.json {
            println!("{}", as_json(&listing, now));
            return 0;
        }
        if !args.watch {
            print!("{}", as_table(&listing, now, None));
            return 0;
        }
        let seen = Seen::of(&listing);
        let mut out = String::new();
        let terminal = std::io::stdout().is_terminal();
        if terminal {
            // Home, then clear the screen: the table replaces the last one.
            out.push_str("\x1b[H\x1b[2J");
        }
        let at = when::local(now).unwrap_or_default();
        out.push_str(&format!(
            "every {}: distlock list {prefix}   {at}\n\n",
            crate::show_duration(args.interval)
        ));
        out.push_str(&as_table(&listing, now, last.as_ref().map(|l| (l, &seen))));
        if !terminal {
            out.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            // The reader went away (a closed pipe): nothing more to show.
            return 0;
        }
        drop(stdout);
        last = Some(seen);
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            _ = tokio::signal::ctrl_c() => return 0,
        }
    }
}

/// What one read showed, for the next one's marks: each lock's rows.
struct Seen(BTreeMap<String, Vec<String>>);

impl Seen {
    fn of(listing: &Listing) -> Self {
        Seen(
            listing
                .locks
                .iter()
                .map(|l| (l.name.clone(), row_keys(&l.status)))
                .collect(),
        )
    }
}

/// What identifies each row of a lock across reads: its holder's kind, label and fence.
fn row_keys(status: &Result<LockStatus, distlock::LockError>) -> Vec<String> {
    match status {
        Ok(st) => st
            .holders
            .iter()
            .map(|h| format!("{:?} {:?} {:?}", h.kind, h.owner, h.fence))
            .collect(),
        Err(e) => vec![e.to_string()],
    }
}

/// The JSON form (see `ListArgs::json`).
fn as_json(listing: &Listing, now: u128) -> serde_json::Value {
    let locks: Vec<serde_json::Value> = listing
        .locks
        .iter()
        .map(|l| match &l.status {
            Ok(st) => {
                let mut v = crate::status::as_json(&l.name, st);
                v["name"] = serde_json::Value::from(l.name.clone());
                v
            }
            Err(e) => serde_json::json!({ "name": l.name, "key": l.name, "error": e.to_string() }),
        })
        .collect();
    serde_json::json!({
        "locks": locks,
        "more": listing.more,
        "at_ms": u64::try_from(now).unwrap_or(u64::MAX),
        "at": when::rfc3339(now),
    })
}

/// The kind as the table shows it.
fn kind_text(kind: LeaseKind, holders: usize) -> String {
    match kind {
        LeaseKind::Exclusive => "exclusive".into(),
        LeaseKind::Shared => format!("shared ({holders})"),
        LeaseKind::Permit { permits } => format!("permit ({holders}/{permits})"),
        _ => kind.name().into(),
    }
}

/// The table: one row per holder, the lock's name and waiters on its first row; with the
/// last read (`marks`), a first column marking new (+) and changed (~) rows, and the locks
/// that went at the end.
fn as_table(listing: &Listing, now: u128, marks: Option<(&Seen, &Seen)>) -> String {
    let mut rows: Vec<[String; 9]> = vec![[
        String::new(),
        "NAME".into(),
        "KIND".into(),
        "HOLDER".into(),
        "HELD FOR".into(),
        "SINCE".into(),
        "TTL LEFT".into(),
        "FENCE".into(),
        "WAITERS".into(),
    ]];
    for lock in &listing.locks {
        let before = marks.and_then(|(last, _)| last.0.get(&lock.name));
        // A row with no holder: the lock's status could not be read, or only waiters wait.
        let new_name = if before.is_none() && marks.is_some() {
            "+"
        } else {
            ""
        };
        let no_holder = |kind: &str, holder: String, waiters: String| {
            let mut row: [String; 9] = Default::default();
            row[0] = new_name.into();
            row[1] = lock.name.clone();
            row[2] = kind.into();
            row[3] = holder;
            row[8] = waiters;
            row
        };
        let st = match &lock.status {
            Ok(st) => st,
            Err(e) => {
                rows.push(no_holder("?", format!("error: {e}"), String::new()));
                continue;
            }
        };
        let waiters = st.waiters.map_or("?".into(), |n| n.to_string());
        if st.holders.is_empty() {
            rows.push(no_holder("-", "(free, waited for)".into(), waiters));
            continue;
        }
        let keys = row_keys(&lock.status);
        for (i, h) in st.holders.iter().enumerate() {
            let mark = match before {
                _ if marks.is_none() => "",
                None => "+",
                Some(b) if !b.contains(&keys[i]) => "~",
                Some(_) => "",
            };
            let (who, since) = match h.owner.as_deref().map(when::split_label) {
                Some((who, since)) => (who.to_owned(), since),
                None => ("unknown".to_owned(), None),
            };
            let held_for = since
                .and_then(|s| now.checked_sub(s))
                .map_or(String::new(), |ago| {
                    when::duration(Duration::from_millis(
                        u64::try_from(ago).unwrap_or(u64::MAX),
                    ))
                });
            let since = since.and_then(when::local).unwrap_or_default();
            let ttl = h.ttl.map_or("no expiry".into(), when::duration);
            let fence = match (h.fence, st.last_fence) {
                (Some(f), _) => f.to_string(),
                (None, Some(last)) if h.kind == LeaseKind::Exclusive => format!("≤{last}"),
                (None, _) => "-".into(),
            };
            let first = i == 0;
            rows.push([
                mark.into(),
                if first {
                    lock.name.clone()
                } else {
                    String::new()
                },
                kind_text(h.kind, st.holders.len()),
                who,
                held_for,
                since,
                ttl,
                fence,
                if first {
                    waiters.clone()
                } else {
                    String::new()
                },
            ]);
        }
    }
    let mut out = render(&rows, marks.is_some());
    if let Some((last, seen)) = marks {
        for gone in last.0.keys().filter(|k| !seen.0.contains_key(*k)) {
            out.push_str(&format!("- {gone} (no longer held)\n"));
        }
    }
    let n = listing.locks.len();
    out.push_str(&format!(
        "{n} lock{} held or waited for{}\n",
        if n == 1 { "" } else { "s" },
        if listing.more {
            " (more beyond --limit)"
        } else {
            ""
        }
    ));
    out
}

/// Aligned columns, two spaces apart; the mark column only when marks are shown.
fn render(rows: &[[String; 9]], marks: bool) -> String {
    let first = usize::from(!marks);
    // The mark column keeps its width when no row is marked, so the table does not shift.
    let mut widths = [usize::from(marks), 0, 0, 0, 0, 0, 0, 0, 0];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate().skip(first) {
            if i > first {
                line.push_str("  ");
            }
            line.push_str(cell);
            line.push_str(&" ".repeat(widths[i] - cell.chars().count()));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::{HolderStatus, ListedLock};

    fn listing(locks: Vec<(&str, LockStatus)>) -> Listing {
        let mut l = Listing::default();
        l.locks = locks
            .into_iter()
            .map(|(name, st)| ListedLock::new(name.to_owned(), Ok(st)))
            .collect();
        l
    }

    #[test]
    fn a_table_row_per_holder_and_marks_between_reads() {
        let now = 1_795_693_212_345u128;
        let writer = LockStatus::held(
            Some(format!("web-1/42 since {}", now - 12_300)),
            Some(7),
            Some(Duration::from_millis(2500)),
        )
        .with_waiters(Some(2));
        let reader = |pid: u32| {
            HolderStatus::new(LeaseKind::Shared)
                .owner(Some(format!("web-2/{pid} since {}", now - 1_000)))
                .fence(Some(3))
        };
        let readers = LockStatus::held_by(vec![reader(1), reader(2)]);
        let first = listing(vec![("deploy", writer.clone())]);
        let t = as_table(&first, now, None);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{t}");
        assert!(lines[1].starts_with("deploy  exclusive"), "{t}");
        assert!(lines[1].contains("web-1/42  12.3 s"), "{t}");
        assert!(lines[1].contains("2.5 s"), "{t}");
        assert!(lines[1].trim_end().ends_with("7      2"), "{t}");
        assert_eq!(lines[2], "1 lock held or waited for");
        let second = listing(vec![("report", readers)]);
        let marked = as_table(&second, now, Some((&Seen::of(&first), &Seen::of(&second))));
        let lines: Vec<&str> = marked.lines().collect();
        assert!(lines[1].starts_with("+  report  shared (2)"), "{marked}");
        assert!(lines[2].starts_with("+          shared (2)"), "{marked}");
        assert_eq!(lines[3], "- deploy (no longer held)");
        let v = as_json(&first, now);
        assert_eq!(v["locks"][0]["name"], "deploy");
        assert_eq!(v["locks"][0]["fence"], 7);
        assert_eq!(v["locks"][0]["waiters"], 2);
        assert_eq!(v["at"], "2026-11-26T11:40:12.345Z");
        assert_eq!(v["more"], false);
    }
}
