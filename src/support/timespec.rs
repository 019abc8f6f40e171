//! Times and durations as operators type them: `now`, `+10m`, `-1h`,
//! RFC 3339 (`2026-12-01T20:00:00Z`), and human durations (`15m`, `1h 30m`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Redis's `TIME` reply (seconds, microseconds) as Unix milliseconds.
pub fn redis_time_ms((secs, micros): (i64, i64)) -> i64 {
    secs * 1000 + micros / 1000
}

/// A point in time, in Unix milliseconds, relative to `now_ms`.
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("now") {
        return Ok(now_ms);
    }
    if let Some(rest) = t.strip_prefix('+') {
        return Ok(now_ms.saturating_add(duration_ms(rest, text)?));
    }
    if let Some(rest) = t.strip_prefix('-') {
        return Ok(now_ms.saturating_sub(duration_ms(rest, text)?));
    }
    let at = humantime::parse_rfc3339_weak(t).map_err(|_| {
        Error::InvalidInput(format!(
            "time '{text}' is not understood: use RFC 3339 (2026-12-01T20:00:00Z), `now`, or `+10m`/`-1h`"
        ))
    })?;
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .map_err(|_| Error::InvalidInput(format!("time '{text}' is before 1970")))
}

fn duration_ms(text: &str, whole: &str) -> Result<i64> {
    let d = parse_duration(text).map_err(|_| {
        Error::InvalidInput(format!(
            "time '{whole}' is not understood: after +/- give a duration such as 10m or 1h30m"
        ))
    })?;
    i64::try_from(d.as_millis())
        .map_err(|_| Error::InvalidInput(format!("time '{whole}' is too far away")))
}

/// A human duration: `15m`, `90s`, `1h 30m`, `500ms`.
pub fn parse_duration(text: &str) -> Result<Duration> {
    humantime::parse_duration(text.trim()).map_err(|_| {
        Error::InvalidInput(format!(
            "duration '{text}' is not understood: use e.g. 15m, 90s, 1h30m, 500ms"
        ))
    })
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds.
pub fn format_ms(ms: i64) -> String {
    let Ok(ms) = u64::try_from(ms) else {
        return format!("{ms} ms");
    };
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A duration in milliseconds the way people read it: `15m`, `1h 30m`.
pub fn format_duration_ms(ms: i64) -> String {
    let ms = u64::try_from(ms).unwrap_or(0);
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn relative_and_absolute_times() {
        assert_eq!(parse_time("now", NOW).unwrap(), NOW);
        assert_eq!(parse_time("+10m", NOW).unwrap(), NOW + 600_000);
        assert_eq!(parse_time("-1h", NOW).unwrap(), NOW - 3_600_000);
        assert_eq!(
            parse_time("2026-12-01T20:00:00.250Z", 0).unwrap(),
            1_796_155_200_250
        );
    }

    #[test]
    fn garbage_is_named_in_the_error() {
        let e = parse_time("tomorrow-ish", NOW).unwrap_err().to_string();
        assert!(e.contains("tomorrow-ish"), "{e}");
        assert!(parse_time("+ten minutes", NOW).is_err());
        assert!(parse_duration("fifteen").is_err());
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
    }

    #[test]
    fn formats_round_trip() {
        let t = parse_time("2026-12-01T20:00:00.250Z", 0).unwrap();
        assert_eq!(format_ms(t), "2026-12-01T20:00:00.250Z");
        assert_eq!(format_duration_ms(900_000), "15m");
    }
}
