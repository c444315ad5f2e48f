//! Wall-clock timestamps for log lines, in UTC, without a time-zone database.

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
    let (days, ms_of_day) = (millis.div_euclid(86_400_000), millis.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let secs = ms_of_day / 1000;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ms_of_day % 1000
    )
}

/// `12:03:04` (UTC), for the console.
pub fn format_time_of_day(unix: f64) -> String {
    let full = format_utc(unix);
    full[11..19].to_string()
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
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
