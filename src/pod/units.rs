//! Parsing the units Kubernetes writes: Go durations (`20s`, `1m30s`, `500ms`) and resource
//! quantities (`100m`, `1.5`, `64Mi`, `1G`, `1e3`); and writing durations as kubectl shows
//! ages (`2m30s`, `3h1m`, `2d2h`).

use std::time::Duration;

/// A Go `time.ParseDuration` string.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(format!("invalid duration {s:?}"));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("invalid duration {s:?}: missing unit"))?;
        if num_end == 0 {
            return Err(format!("invalid duration {s:?}"));
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| format!("invalid duration {s:?}"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => return Err(format!("invalid duration {s:?}: unknown unit {u:?}")),
        };
        total += n * mult;
        rest = &rest[unit_end..];
    }
    // Go's ParseDuration refuses what does not fit its int64 of nanoseconds (about 292
    // years); from_secs_f64 would panic on what does not fit a Duration.
    if total > i64::MAX as f64 / 1e9 {
        return Err(format!("invalid duration {s:?}: out of range"));
    }
    Duration::try_from_secs_f64(total).map_err(|_| format!("invalid duration {s:?}"))
}

/// Format like Go's `Duration.String()` for the common cases (`10s`, `5m0s`, `1h0m0s`).
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 && secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// A resource quantity as a number (for memory: bytes; for cpu: cores, use [`milli`]).
pub fn parse_quantity(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let bad = || format!("invalid quantity {s:?}");
    if t.is_empty() {
        return Err(bad());
    }
    let suffixes: [(&str, f64); 15] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suf, mult) in suffixes {
        if let Some(num) = t.strip_suffix(suf) {
            let n: f64 = num.parse().map_err(|_| bad())?;
            return if n < 0.0 { Err(bad()) } else { Ok(n * mult) };
        }
    }
    let n: f64 = t.parse().map_err(|_| bad())?;
    if n < 0.0 || !n.is_finite() {
        return Err(bad());
    }
    Ok(n)
}

/// A cpu quantity in millicores, rounded up like Kubernetes' MilliValue.
pub fn milli(s: &str) -> Result<i64, String> {
    let v = parse_quantity(s)? * 1000.0;
    // 1900m parses as 1.9 cores, which times 1000 is 1900.0000000000002 in floating point:
    // a value that close to a whole millicore is that millicore, not the next one up.
    let nearest = v.round();
    Ok(if (v - nearest).abs() < 1e-6 { nearest } else { v.ceil() } as i64)
}

/// A byte quantity, rounded up.
pub fn bytes(s: &str) -> Result<i64, String> {
    Ok(parse_quantity(s)?.ceil() as i64)
}

/// kubectl's duration.HumanDuration.
pub fn human_duration(secs: i64) -> String {
    // `3h` or `3h1m`: a count in the bigger unit, and the rest in the smaller one unless 0.
    fn two(big: i64, big_unit: &str, small: i64, small_unit: &str) -> String {
        if small == 0 {
            format!("{big}{big_unit}")
        } else {
            format!("{big}{big_unit}{small}{small_unit}")
        }
    }
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        return two(m, "m", s % 60, "s");
    }
    if m < 180 {
        return format!("{m}m");
    }
    let h = m / 60;
    if h < 8 {
        return two(h, "h", m % 60, "m");
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        return two(h / 24, "d", h % 24, "h");
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    format!("{}y", h / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(50 * 3600), "2d2h");
    }

    #[test]
    fn a_duration_past_go_s_range_is_an_error_not_a_panic() {
        // Found by the kubelet_config fuzz target (syncFrequency).
        let e = parse_duration("1m111111111111111111111000s").unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        assert!(parse_duration("2562047h").is_ok(), "Go's largest whole hour fits");
        assert!(parse_duration("2562048h").is_err());
    }

    #[test]
    fn millicores_are_exact() {
        assert_eq!(milli("1900m").unwrap(), 1900);
        assert_eq!(milli("1.9").unwrap(), 1900);
        assert_eq!(milli("0.1").unwrap(), 100);
        assert_eq!(milli("0.0001").unwrap(), 1);
        assert_eq!(milli("2").unwrap(), 2000);
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("20").is_err());
        assert!(parse_duration("20x").is_err());
        assert_eq!(format_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_duration(Duration::from_secs(10)), "10s");
    }

    #[test]
    fn quantities() {
        assert_eq!(milli("100m").unwrap(), 100);
        assert_eq!(milli("1").unwrap(), 1000);
        assert_eq!(milli("0.5").unwrap(), 500);
        assert_eq!(bytes("64Mi").unwrap(), 64 << 20);
        assert_eq!(bytes("1G").unwrap(), 1_000_000_000);
        assert_eq!(bytes("1e3").unwrap(), 1000);
        assert!(bytes("-1").is_err());
        assert!(bytes("lots").is_err());
    }
}
