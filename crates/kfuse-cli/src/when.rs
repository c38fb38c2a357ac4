//! Readable times for `kfuse cache list`: a UTC date and how long ago it was
//! (`2026-11-27 10:31 UTC (3 min ago)`).

/// The UTC date and minute of `unix_s` seconds since the Unix epoch, e.g. `2026-11-27 10:31 UTC`.
pub fn utc_minute(unix_s: u64) -> String {
    let days = unix_s / 86_400;
    let (hour, minute) = ((unix_s % 86_400) / 3600, (unix_s % 3600) / 60);
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02} UTC")
}

/// How long before `now_s` the time `then_s` was: `just now`, `5 s ago`, `3 min ago`, `2 h ago`,
/// `4 days ago`; `in the future` for a clock that ran back.
pub fn age(then_s: u64, now_s: u64) -> String {
    let Some(ago) = now_s.checked_sub(then_s) else { return "in the future".to_string() };
    match ago {
        0 => "just now".to_string(),
        1..=59 => format!("{ago} s ago"),
        60..=3599 => format!("{} min ago", ago / 60),
        3600..=86_399 => format!("{} h ago", ago / 3600),
        86_400..=172_799 => "1 day ago".to_string(),
        _ => format!("{} days ago", ago / 86_400),
    }
}

/// Both: `2026-11-27 10:31 UTC (3 min ago)`.
pub fn date_and_age(then_s: u64, now_s: u64) -> String {
    format!("{} ({})", utc_minute(then_s), age(then_s, now_s))
}

/// (year, month, day) of the proleptic Gregorian calendar, `days` after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
pub(crate) fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_minute(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_minute(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_minute(1_709_251_199), "2024-02-29 23:59 UTC");
        assert_eq!(utc_minute(1_798_367_460), "2026-12-27 10:31 UTC");
        assert_eq!(utc_minute(4_107_542_400), "2100-03-01 00:00 UTC");
    }

    #[test]
    fn ages_read_as_people_say_them() {
        let now = 1_800_000_000;
        assert_eq!(age(now, now), "just now");
        assert_eq!(age(now - 5, now), "5 s ago");
        assert_eq!(age(now - 180, now), "3 min ago");
        assert_eq!(age(now - 7200, now), "2 h ago");
        assert_eq!(age(now - 86_400, now), "1 day ago");
        assert_eq!(age(now - 4 * 86_400 - 5, now), "4 days ago");
        assert_eq!(age(now + 10, now), "in the future");
        assert_eq!(date_and_age(0, 60), "1970-01-01 00:00 UTC (1 min ago)");
    }
}
