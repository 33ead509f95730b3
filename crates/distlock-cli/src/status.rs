//! `distlock status`.

use clap::Args;
use std::time::Duration;

use distlock::{LeaseKind, LockStatus};

use crate::{exit, when};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// Print one JSON object: key, held, owner, since_ms, since (RFC 3339), fence, last_fence,
    /// ttl_ms (of the first holder), holders (every holder: kind, permits, token, owner,
    /// since_ms, since, fence, ttl_ms) and waiters.
    #[arg(long)]
    json: bool,
    /// The lock name.
    key: String,
}

pub(crate) async fn status(args: StatusArgs) -> u8 {
    let client = match args.engine.client().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let st = match client.status(&args.key).await {
        Ok(s) => s,
        Err(e) => return exit::report("cannot read the lock", &e),
    };
    if args.json {
        println!("{}", as_json(&args.key, &st));
    } else {
        print!("{}", as_text(&args.key, &st));
    }
    0
}

/// The JSON form: `key`, `held`, `owner`, `since_ms` and `since` (when the first holder took
/// it: Unix milliseconds and RFC 3339), `fence`, `last_fence`, `ttl_ms` (the first holder's;
/// null when unknown), `holders` (each: `kind`, `permits`, `token`, `owner`, `since_ms`,
/// `since`, `fence`, `ttl_ms`) and `waiters` (null when the engine cannot tell).
pub(crate) fn as_json(key: &str, st: &LockStatus) -> serde_json::Value {
    let holders: Vec<serde_json::Value> = st
        .holders
        .iter()
        .map(|h| {
            let (since_ms, since) = since_fields(h.owner.as_deref());
            serde_json::json!({
                "kind": h.kind.name(),
                "permits": match h.kind {
                    LeaseKind::Permit { permits } => Some(permits),
                    _ => None,
                },
                "token": h.token,
                "owner": h.owner,
                "fence": h.fence,
                "ttl_ms": h.ttl.map(ms),
                "since_ms": since_ms,
                "since": since,
            })
        })
        .collect();
    let (since_ms, since) = since_fields(st.owner.as_deref());
    serde_json::json!({
        "key": key,
        "held": st.held,
        "owner": st.owner,
        "since_ms": since_ms,
        "since": since,
        "fence": st.fence,
        "last_fence": st.last_fence,
        "ttl_ms": st.ttl.map(ms),
        "holders": holders,
        "waiters": st.waiters,
    })
}

fn ms(t: Duration) -> u64 {
    u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
}

/// The text form: one block per holder, then the waiters.
pub(crate) fn as_text(key: &str, st: &LockStatus) -> String {
    let waiters = match st.waiters {
        Some(n) if n > 0 => format!("  waiting: {n}\n"),
        _ => String::new(),
    };
    if !st.held {
        return format!("{key}: free\n{waiters}");
    }
    let mut out = match st.holders.first().map(|h| h.kind) {
        Some(LeaseKind::Shared) => format!("{key}: held by {} reader(s)\n", st.holders.len()),
        Some(LeaseKind::Permit { permits }) => {
            format!("{key}: {} of {permits} permit(s) held\n", st.holders.len())
        }
        _ => format!("{key}: held\n"),
    };
    let many = st.holders.len() > 1 || st.holders.iter().any(|h| h.kind != LeaseKind::Exclusive);
    for h in &st.holders {
        let owner = h.owner.as_deref().map_or("unknown".into(), with_age);
        let fence = match (h.fence, st.last_fence) {
            (Some(f), _) => f.to_string(),
            // Taken on the engine's fast path, which does not record it: at most the last one
            // issued.
            (None, Some(last)) if h.kind == LeaseKind::Exclusive => format!("at most {last}"),
            (None, _) => "none".into(),
        };
        let ttl = h
            .ttl
            .map_or("no expiry (held until the holder exits)".into(), |t| {
                format!("{} left", when::duration(t))
            });
        if many {
            out.push_str(&format!("  - {}\n", h.kind.name()));
            if let Some(token) = &h.token {
                out.push_str(&format!("    token:  {token}\n"));
            }
            out.push_str(&format!(
                "    owner:  {owner}\n    fence:  {fence}\n    ttl:    {ttl}\n"
            ));
        } else {
            out.push_str(&format!(
                "  owner:  {owner}\n  fence:  {fence}\n  ttl:    {ttl}\n"
            ));
            if let Some(token) = &h.token {
                out.push_str(&format!("  token:  {token}\n"));
            }
        }
    }
    out.push_str(&waiters);
    out
}

/// `host/pid since <unix ms>` as `host/pid (for 12.3 s, since <local date and time>)`.
fn with_age(owner: &str) -> String {
    match when::split_label(owner) {
        (who, Some(since)) => format!("{who} ({})", when::since(since, when::now_ms())),
        (who, None) => who.to_owned(),
    }
}

/// The JSON fields of a holder label's time: `since_ms` (Unix milliseconds) and `since`
/// (RFC 3339), null when the label has none.
fn since_fields(owner: Option<&str>) -> (Option<u128>, Option<String>) {
    let ms = owner.and_then(|o| when::split_label(o).1);
    (ms, ms.and_then(when::rfc3339))
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock::HolderStatus;

    #[test]
    fn json_has_the_documented_fields() {
        let st = LockStatus::held(
            Some("h/1 since 5".into()),
            Some(3),
            Some(Duration::from_secs(2)),
        );
        let v = as_json("k\"1", &st);
        assert_eq!(v["since_ms"], 5);
        assert_eq!(v["since"], "1970-01-01T00:00:00.005Z");
        assert_eq!(v["key"], "k\"1");
        assert_eq!(v["held"], true);
        assert_eq!(v["fence"], 3);
        assert_eq!(v["ttl_ms"], 2000);
        assert!(v["last_fence"].is_null());
        let free = as_json("k", &LockStatus::free());
        assert_eq!(free["held"], false);
        assert!(free["owner"].is_null());
    }

    #[test]
    fn every_holder_is_listed() {
        let reader = |t: &str, f: u64| {
            HolderStatus::new(LeaseKind::Shared)
                .token(Some(t.into()))
                .owner(Some(format!("h/{f} since 5")))
                .fence(Some(f))
                .ttl(Some(Duration::from_millis(700)))
        };
        let st = LockStatus::held_by(vec![reader("t1", 4), reader("t2", 4)])
            .with_last_fence(Some(4))
            .with_waiters(Some(3));
        let v = as_json("k", &st);
        assert_eq!(v["holders"].as_array().unwrap().len(), 2);
        assert_eq!(v["holders"][1]["token"], "t2");
        assert_eq!(v["holders"][0]["kind"], "shared");
        assert_eq!(v["holders"][0]["ttl_ms"], 700);
        assert!(v["holders"][0]["permits"].is_null());
        assert_eq!(v["waiters"], 3);
        let t = as_text("k", &st);
        assert!(t.starts_with("k: held by 2 reader(s)\n"), "{t}");
        assert!(t.contains("token:  t2"), "{t}");
        assert!(t.contains("waiting: 3"), "{t}");
        let p = LockStatus::held_by(vec![
            HolderStatus::new(LeaseKind::Permit { permits: 3 }).fence(Some(9)),
        ]);
        assert_eq!(as_json("k", &p)["holders"][0]["permits"], 3);
        assert!(as_text("k", &p).starts_with("k: 1 of 3 permit(s) held"));
    }

    #[test]
    fn text_shows_the_age_of_a_hold() {
        let st = LockStatus::held(Some("h/1 since 1000".into()), None, None);
        let t = as_text("k", &st);
        assert!(t.contains("owner:  h/1 (for "), "{t}");
        assert!(t.contains(", since 1970-01-01 "), "{t}");
        assert!(t.contains("fence:  none"), "{t}");
        assert_eq!(as_text("k", &LockStatus::free()), "k: free\n");
    }
}
