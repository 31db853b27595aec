//! The Grafana units the dashboards use (`fieldConfig.defaults.unit`), as the report writes a
//! value of each: a unit the report does not know is a finding, so that a typo in a dashboard
//! (Grafana shows a bare number for an unknown unit) does not go unseen.

/// Grafana unit ids the report formats.
pub const KNOWN: &[&str] = &[
    "",
    "none",
    "short",
    "s",
    "ms",
    "ops",
    "reqps",
    "wps",
    "percentunit",
    "percent",
    "bytes",
];

pub fn known(unit: &str) -> bool {
    KNOWN.contains(&unit)
}

/// `value` in `unit`, short, as on an axis or a stat panel.
pub fn format(unit: &str, value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    match unit {
        "s" if value != 0.0 && value.abs() < 1.0 => format!("{} ms", short(value * 1000.0)),
        "s" => format!("{} s", short(value)),
        "ms" => format!("{} ms", short(value)),
        "ops" => format!("{} ops/s", short(value)),
        "reqps" => format!("{} req/s", short(value)),
        "wps" => format!("{} wps", short(value)),
        "percentunit" => format!("{}%", short(value * 100.0)),
        "percent" => format!("{}%", short(value)),
        "bytes" => bytes(value),
        _ => short(value),
    }
}

/// At most three significant digits, with k/M/G above a thousand.
fn short(value: f64) -> String {
    let (scaled, suffix) = match value.abs() {
        v if v >= 1e9 => (value / 1e9, "G"),
        v if v >= 1e6 => (value / 1e6, "M"),
        v if v >= 1e3 => (value / 1e3, "k"),
        _ => (value, ""),
    };
    let digits = match scaled.abs() {
        v if v >= 100.0 || v == 0.0 => 0,
        v if v >= 10.0 => 1,
        v if v >= 1.0 => 2,
        _ => 3,
    };
    let text = format!("{scaled:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    };
    format!("{text}{suffix}")
}

fn bytes(value: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut scaled = value;
    let mut unit = 0;
    while scaled.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        scaled /= 1024.0;
        unit += 1;
    }
    format!("{} {}", short(scaled), UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_in_their_unit() {
        assert_eq!(format("s", 0.25), "250 ms");
        assert_eq!(format("s", 12.5), "12.5 s");
        assert_eq!(format("ops", 3.0), "3 ops/s");
        assert_eq!(format("percentunit", 0.125), "12.5%");
        assert_eq!(format("bytes", 3.0 * 1024.0 * 1024.0), "3 MiB");
        assert_eq!(format("short", 12_345.0), "12.3k");
        assert_eq!(format("short", 0.0), "0");
        assert!(known("wps") && !known("sec"));
    }
}
