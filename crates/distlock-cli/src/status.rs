//! `distlock status`.

use clap::Args;

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
    let client = match distlock::connect(args.engine.url()).await {
        Ok(c) => c,
        Err(e) => return exit::report("cannot open the lock engine", &e),
    };
    let st = match client.status(&args.key).await {
        Ok(s) => s,
        Err(e) => return exit::report("cannot read the lock", &e),
    };
    let ttl_ms = st.ttl.map(|t| t.as_millis());
    if args.json {
        let owner = st.owner.as_deref().map_or("null".into(), json_string);
        let fence = st.fence.map_or("null".into(), |f| f.to_string());
        let last = st.last_fence.map_or("null".into(), |f| f.to_string());
        let ttl = ttl_ms.map_or("null".into(), |t| t.to_string());
        println!(
            "{{\"key\":{},\"held\":{},\"owner\":{owner},\"fence\":{fence},\"last_fence\":{last},\"ttl_ms\":{ttl}}}",
            json_string(&args.key),
            st.held
        );
    } else if st.held {
        println!("{}: held", args.key);
        println!("  owner:  {}", st.owner.as_deref().unwrap_or("unknown"));
        let fence = match (st.fence, st.last_fence) {
            (Some(f), _) => f.to_string(),
            // Taken on the engine's fast path, which does not record it: at most the last one
            // issued.
            (None, Some(last)) => format!("at most {last}"),
            (None, None) => "none".into(),
        };
        println!("  fence:  {fence}");
        println!(
            "  ttl:    {}",
            ttl_ms.map_or(
                "no expiry (held until the holder exits)".into(),
                |t| format!("{t} ms")
            )
        );
    } else {
        println!("{}: free", args.key);
    }
    0
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(
            super::json_string("a\"b\\c\n\u{1}"),
            "\"a\\\"b\\\\c\\n\\u0001\""
        );
    }
}
