//! Wall-clock timestamps for log lines, in UTC (jiff's calendar; no time-zone database).

use std::time::{SystemTime, UNIX_EPOCH};

pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `2026-11-22 12:03:04.123` (UTC) for seconds since the Unix epoch.
pub fn format_utc(unix: f64) -> String {
    let millis = (unix.max(0.0) * 1000.0).round() as i64;
    jiff::Timestamp::from_millisecond(millis)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%d %H:%M:%S%.3f")
        .to_string()
}

/// `12:03:04` (UTC), for the console.
pub fn format_time_of_day(unix: f64) -> String {
    let full = format_utc(unix);
    full[11..19].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_utc(0.0), "1970-01-01 00:00:00.000");
        // `date -u -d @1795349584.5 '+%F %T'` → 2026-11-22 12:13:04
        assert_eq!(format_utc(1_795_349_584.5), "2026-11-22 12:13:04.500");
        assert_eq!(format_utc(951_782_400.0), "2000-02-29 00:00:00.000");
        assert_eq!(format_time_of_day(1_795_349_584.5), "12:13:04");
    }
}
