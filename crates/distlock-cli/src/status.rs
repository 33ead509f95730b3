//! `distlock status`.

use clap::Args;
use distlock::LockStatus;

use crate::exit;

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    engine: crate::Engine,
    /// Print one JSON object: key, held, owner, fence, last_fence, ttl_ms.
    #[arg(long)]
    json: bool,
    /// The lock name.
    key: String,
}

pub(crate) async fn status(args: StatusArgs) -> u8 {
    let url = match args.engine.url() {
        Ok(u) => u,
        Err(e) => return exit::report_open(&e),
    };
    let client = match distlock::connect(&url).await {
        Ok(c) => c,
        Err(e) => return exit::report_open(&e),
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

/// The JSON form: `key`, `held`, `owner`, `fence`, `last_fence`, `ttl_ms` (null when unknown).
pub(crate) fn as_json(key: &str, st: &LockStatus) -> serde_json::Value {
    serde_json::json!({
        "key": key,
        "held": st.held,
        "owner": st.owner,
        "fence": st.fence,
        "last_fence": st.last_fence,
        "ttl_ms": st.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    })
}

/// The text form, a line per field.
pub(crate) fn as_text(key: &str, st: &LockStatus) -> String {
    if !st.held {
        return format!("{key}: free\n");
    }
    let owner = st.owner.as_deref().map_or("unknown".into(), with_age);
    let fence = match (st.fence, st.last_fence) {
        (Some(f), _) => f.to_string(),
        // Taken on the engine's fast path, which does not record it: at most the last one
        // issued.
        (None, Some(last)) => format!("at most {last}"),
        (None, None) => "none".into(),
    };
    let ttl = st
        .ttl
        .map_or("no expiry (held until the holder exits)".into(), |t| {
            format!("{} ms", t.as_millis())
        });
    format!("{key}: held\n  owner:  {owner}\n  fence:  {fence}\n  ttl:    {ttl}\n")
}

/// `host/pid since <unix ms>` with how long ago that was.
fn with_age(owner: &str) -> String {
    let Some((who, since)) = owner.rsplit_once(" since ") else {
        return owner.to_owned();
    };
    let Ok(since) = since.parse::<u128>() else {
        return owner.to_owned();
    };
    let now = distlock::engine::unix_ms();
    if since == 0 || since > now {
        return owner.to_owned();
    }
    let ago = (now - since) as f64 / 1000.0;
    format!("{who} (for {ago:.1} s, since {since} ms after the epoch)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn json_has_the_documented_fields() {
        let st = LockStatus::held(
            Some("h/1 since 5".into()),
            Some(3),
            Some(Duration::from_secs(2)),
        );
        let v = as_json("k\"1", &st);
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
    fn text_shows_the_age_of_a_hold() {
        let st = LockStatus::held(Some("h/1 since 1000".into()), None, None);
        let t = as_text("k", &st);
        assert!(t.contains("owner:  h/1 (for "), "{t}");
        assert!(t.contains("fence:  none"), "{t}");
        assert_eq!(as_text("k", &LockStatus::free()), "k: free\n");
    }
}
