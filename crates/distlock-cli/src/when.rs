//! Times for people: how long ago, and the local date and time; RFC 3339 for scripts.

use std::time::Duration;

/// Milliseconds since the Unix epoch now.
pub(crate) fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A duration as people read it: `850 ms`, `12.3 s`, `4 min 05 s`, `3 h 02 min`, `2 d 04 h`.
pub(crate) fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        _ if ms < 1_000 => format!("{ms} ms"),
        0..60 => format!("{:.1} s", d.as_secs_f64()),
        60..3_600 => format!("{} min {:02} s", s / 60, s % 60),
        3_600..86_400 => format!("{} h {:02} min", s / 3_600, s % 3_600 / 60),
        _ => format!("{} d {:02} h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// The local date and time of `unix_ms`, with the zone's abbreviation:
/// `2026-11-26 11:40:12 UTC`. The system's time zone (`TZ`, else `/etc/localtime`).
pub(crate) fn local(unix_ms: u128) -> Option<String> {
    let ts = jiff::Timestamp::from_millisecond(i64::try_from(unix_ms).ok()?).ok()?;
    let zoned = ts.to_zoned(jiff::tz::TimeZone::system());
    Some(zoned.strftime("%Y-%m-%d %H:%M:%S %Z").to_string())
}

/// `unix_ms` in RFC 3339, in UTC with milliseconds: `2026-11-26T11:40:12.345Z`.
pub(crate) fn rfc3339(unix_ms: u128) -> Option<String> {
    let ts = jiff::Timestamp::from_millisecond(i64::try_from(unix_ms).ok()?).ok()?;
    Some(format!("{ts:.3}"))
}

/// Since `unix_ms`, as of `now_ms`: `for 12.3 s, since 2026-11-26 11:40:12 UTC`. A time in
/// the future (another host's clock ahead of ours) shows the time alone.
pub(crate) fn since(unix_ms: u128, now_ms: u128) -> String {
    let at = local(unix_ms).unwrap_or_else(|| format!("{unix_ms} ms after the epoch"));
    match now_ms.checked_sub(unix_ms) {
        Some(ago) => format!(
            "for {}, since {at}",
            duration(Duration::from_millis(
                u64::try_from(ago).unwrap_or(u64::MAX)
            ))
        ),
        None => format!("since {at} (ahead of this host's clock)"),
    }
}

/// Splits a holder label `host/pid since <unix ms>` into who and when.
pub(crate) fn split_label(label: &str) -> (&str, Option<u128>) {
    match label.rsplit_once(" since ") {
        Some((who, since)) => match since.parse::<u128>() {
            Ok(ms) if ms > 0 => (who, Some(ms)),
            _ => (label, None),
        },
        None => (label, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_people_say_them() {
        let d = |ms: u64| duration(Duration::from_millis(ms));
        assert_eq!(d(850), "850 ms");
        assert_eq!(d(12_340), "12.3 s");
        assert_eq!(d(245_000), "4 min 05 s");
        assert_eq!(d(3 * 3_600_000 + 120_000), "3 h 02 min");
        assert_eq!(d(2 * 86_400_000 + 4 * 3_600_000), "2 d 04 h");
    }

    #[test]
    fn times_are_local_and_rfc3339() {
        // 2026-11-26T11:40:12.345Z
        let ms = 1_795_693_212_345;
        assert_eq!(rfc3339(ms).as_deref(), Some("2026-11-26T11:40:12.345Z"));
        // The local form is the zone's own; its date and minutes are the same in UTC and in
        // every whole-hour zone.
        let local = local(ms).expect("a local time");
        assert!(local.contains(":40:12"), "{local}");
        let shown = since(ms, ms + 12_300);
        assert!(shown.starts_with("for 12.3 s, since 2026-11-2"), "{shown}");
        assert!(since(ms + 5_000, ms).contains("ahead of this host's clock"));
        assert_eq!(split_label("web-1/42 since 1000"), ("web-1/42", Some(1000)));
        assert_eq!(split_label("web-1/42"), ("web-1/42", None));
        assert_eq!(split_label("a since b"), ("a since b", None));
    }
}
