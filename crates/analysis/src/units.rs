//! Values in units a person reads: `12.4 MB`, `980 kB`, `1.2 k` objects.
//! Bytes use 1024-based steps with pprof's names (kB, MB, GB), as
//! `go tool pprof` prints them, so the two tools' numbers line up.

/// `value` in `unit` ("bytes", "count", "objects", "nanoseconds", ...), short.
pub fn format_value(value: i64, unit: &str) -> String {
    match unit {
        "bytes" | "byte" | "B" => format_bytes(value),
        "nanoseconds" | "ns" => format_scaled(
            value,
            &[
                (1, "ns"),
                (1_000, "µs"),
                (1_000_000, "ms"),
                (1_000_000_000, "s"),
            ],
            " ",
        ),
        _ => format_count(value),
    }
}

/// Like `format_value`, with a leading `+` for growth (diffs).
pub fn format_signed(value: i64, unit: &str) -> String {
    if value > 0 {
        format!("+{}", format_value(value, unit))
    } else {
        format_value(value, unit)
    }
}

pub fn format_bytes(value: i64) -> String {
    const STEPS: [(i64, &str); 5] = [
        (1, "B"),
        (1 << 10, "kB"),
        (1 << 20, "MB"),
        (1 << 30, "GB"),
        (1 << 40, "TB"),
    ];
    format_scaled(value, &STEPS, " ")
}

/// Counts: exact below 10,000, then `12.3k`, `4.5M`, `1.2G`.
pub fn format_count(value: i64) -> String {
    if value.unsigned_abs() < 10_000 {
        return value.to_string();
    }
    format_scaled(
        value,
        &[
            (1, ""),
            (1_000, "k"),
            (1_000_000, "M"),
            (1_000_000_000, "G"),
        ],
        "",
    )
}

/// Picks the largest step not above |value|; 3 significant digits, so a
/// column of numbers stays narrow. `sep` goes between number and unit.
fn format_scaled(value: i64, steps: &[(i64, &str)], sep: &str) -> String {
    let magnitude = value.unsigned_abs();
    let (divisor, name) = steps
        .iter()
        .rev()
        .find(|(divisor, _)| magnitude >= *divisor as u64)
        .copied()
        .unwrap_or(steps[0]);
    if divisor == 1 {
        return format!("{value}{sep}{name}");
    }
    let scaled = value as f64 / divisor as f64;
    let digits = if scaled.abs() >= 100.0 {
        0
    } else if scaled.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{scaled:.digits$}{sep}{name}")
}

/// `part` as a percentage of `whole`, `-` when the whole is zero.
pub fn format_percent(part: i64, whole: i64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

/// A Unix time in nanoseconds as `2026-11-30 01:02:03 UTC`.
pub fn format_time_utc(nanos: i64) -> String {
    let seconds = nanos.div_euclid(1_000_000_000);
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// A duration in nanoseconds as `2.5 s`, `3 min 20 s`, `1 h 5 min`.
pub fn format_duration(nanos: i64) -> String {
    let seconds = nanos as f64 / 1e9;
    if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        format!(
            "{} min {} s",
            (seconds / 60.0) as i64,
            (seconds % 60.0) as i64
        )
    } else {
        format!(
            "{} h {} min",
            (seconds / 3600.0) as i64,
            (seconds % 3600.0 / 60.0) as i64
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_pprof_units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(999), "999 B");
        assert_eq!(format_bytes(1024), "1.00 kB");
        assert_eq!(format_bytes(1536), "1.50 kB");
        assert_eq!(format_bytes(12 * 1024 * 1024 + 400 * 1024), "12.4 MB");
        assert_eq!(format_bytes(300 << 20), "300 MB");
        assert_eq!(format_bytes(-2048), "-2.00 kB");
        assert_eq!(format_bytes(3 << 30), "3.00 GB");
    }

    #[test]
    fn counts_are_exact_when_small() {
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(9_999), "9999");
        assert_eq!(format_count(12_345), "12.3k");
        assert_eq!(format_count(4_500_000), "4.50M");
        assert_eq!(format_count(-20_000), "-20.0k");
        assert_eq!(format_value(5, "count"), "5");
    }

    #[test]
    fn signed_and_percent() {
        assert_eq!(format_signed(2048, "bytes"), "+2.00 kB");
        assert_eq!(format_signed(-2048, "bytes"), "-2.00 kB");
        assert_eq!(format_signed(0, "count"), "0");
        assert_eq!(format_percent(1, 3), "33.3%");
        assert_eq!(format_percent(1, 0), "-");
    }

    #[test]
    fn times_and_durations() {
        assert_eq!(format_time_utc(0), "1970-01-01 00:00:00 UTC");
        // 2026-11-30 01:02:03 UTC
        assert_eq!(
            format_time_utc(1_796_000_523 * 1_000_000_000),
            "2026-11-30 01:02:03 UTC"
        );
        assert_eq!(
            format_time_utc(951_782_400 * 1_000_000_000),
            "2000-02-29 00:00:00 UTC"
        );
        assert_eq!(format_duration(2_500_000_000), "2.5 s");
        assert_eq!(format_duration(200_000_000_000), "3 min 20 s");
        assert_eq!(format_duration(3_900_000_000_000), "1 h 5 min");
    }

    #[test]
    fn durations() {
        assert_eq!(format_value(1_500_000, "nanoseconds"), "1.50 ms");
        assert_eq!(format_value(20, "nanoseconds"), "20 ns");
    }
}
