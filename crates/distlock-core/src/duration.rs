//! Human durations (`30s`, `500ms`, `2m`, `1h`) as used in URLs and on the command line.

use std::time::Duration;

use crate::error::{ErrorKind, LockError};

/// Parses `500ms`, `30s`, `1.5s`, `2m`, `1h`, `1d` (and `0`) into a [`Duration`].
///
/// # Errors
/// `Config` naming the bad text.
pub fn parse_duration(text: &str) -> Result<Duration, LockError> {
    let bad = || {
        LockError::new(
            ErrorKind::Config,
            format!("{text:?} is not a duration (try 500ms, 30s, 2m, 1h)"),
        )
    };
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| bad())?;
    let scale = match unit.trim() {
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" | "sec" | "secs" => 1.0,
        "m" | "min" | "mins" => 60.0,
        "h" | "hr" | "hours" => 3600.0,
        "d" | "days" => 86_400.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("30s").ok(), Some(Duration::from_secs(30)));
        assert_eq!(
            parse_duration("1.5s").ok(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h").ok(), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0").ok(), Some(Duration::ZERO));
        for bad in ["", "10", "ms", "-1s", "1x", "1e999s", "..s"] {
            assert_eq!(
                parse_duration(bad).map_err(|e| e.kind()),
                Err(ErrorKind::Config),
                "{bad}"
            );
        }
    }
}
