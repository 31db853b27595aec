//! What Grafana does to a panel query before its Prometheus datasource sends it (pure): the
//! query interval and step of a time range, the built-in variables (`$__interval`,
//! `$__rate_interval`, `$__range`…), the template variables' values as PromQL text, and the
//! legend of a series. Follows Grafana 10's `rangeutil.roundInterval`,
//! `calculateInterval` and the Prometheus datasource's `getRateIntervalScopedVariable`,
//! `adjustInterval` and `alignRange`.

use std::collections::BTreeMap;

use anyhow::{Context, bail};

/// A query range as Grafana sends it: Unix seconds and the step in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueryRange {
    pub start: f64,
    pub end: f64,
    pub step: f64,
}

/// The built-in variables of one panel's queries.
#[derive(Clone, Debug, PartialEq)]
pub struct Builtins {
    pub interval_ms: u64,
    pub rate_interval_ms: u64,
    pub range_ms: u64,
    pub from_ms: u64,
    pub to_ms: u64,
}

/// Prometheus refuses range queries of more than 11,000 points per series.
const MAX_POINTS: f64 = 11_000.0;

/// Grafana's `roundInterval`: a raw interval (ms) to the next "nice" one.
pub fn round_interval(ms: f64) -> u64 {
    const STEPS: &[(f64, u64)] = &[
        (15.0, 10),
        (35.0, 20),
        (75.0, 50),
        (150.0, 100),
        (350.0, 200),
        (750.0, 500),
        (1_500.0, 1_000),
        (3_500.0, 2_000),
        (7_500.0, 5_000),
        (12_500.0, 10_000),
        (17_500.0, 15_000),
        (25_000.0, 20_000),
        (45_000.0, 30_000),
        (90_000.0, 60_000),
        (210_000.0, 120_000),
        (450_000.0, 300_000),
        (750_000.0, 600_000),
        (1_050_000.0, 900_000),
        (1_500_000.0, 1_200_000),
        (2_700_000.0, 1_800_000),
        (5_400_000.0, 3_600_000),
        (9_000_000.0, 7_200_000),
        (16_200_000.0, 10_800_000),
        (32_400_000.0, 21_600_000),
        (86_400_000.0, 43_200_000),
        (604_800_000.0, 86_400_000),
        (1_814_400_000.0, 604_800_000),
        (3_628_800_000.0, 2_592_000_000),
    ];
    STEPS
        .iter()
        .find(|(below, _)| ms < *below)
        .map_or(31_536_000_000, |(_, nice)| *nice)
}

/// A duration as Grafana writes one (`15s`, `1m`, `500ms`, `1h30m` is `90m`): the largest unit
/// that divides it.
pub fn parse_duration_ms(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .with_context(|| format!("duration {text:?} has no unit"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .with_context(|| format!("duration {text:?}: not a number"))?;
    let factor = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        "w" => 604_800_000.0,
        _ => bail!("duration {text:?}: unknown unit {unit:?}"),
    };
    Ok((number * factor).round() as u64)
}

/// Grafana's `secondsToHms` for whole intervals: `1s`, `2m`, `1h`, `500ms`.
pub fn format_interval(ms: u64) -> String {
    const UNITS: &[(u64, &str)] = &[
        (31_536_000_000, "y"),
        (604_800_000, "w"),
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| ms >= *size && ms.is_multiple_of(*size))
        .map_or_else(
            || format!("{ms}ms"),
            |(size, unit)| format!("{}{unit}", ms / size),
        )
}

/// The interval, step and built-ins of a panel over `[start, end]` (Unix seconds), for a
/// Prometheus datasource whose scrape interval (`timeInterval`) is `scrape_ms`.
pub fn panel_range(
    start: f64,
    end: f64,
    max_data_points: u32,
    min_interval_ms: Option<u64>,
    scrape_ms: u64,
) -> (QueryRange, Builtins) {
    let range_ms = ((end - start) * 1000.0).max(0.0);
    // calculateInterval: the nice interval for the resolution, at least the lower limit.
    let low_limit = min_interval_ms.unwrap_or(scrape_ms);
    let interval_ms = round_interval(range_ms / f64::from(max_data_points.max(1))).max(low_limit);
    // adjustInterval: never more points than Prometheus allows.
    let step_ms = (interval_ms as f64).max((range_ms / MAX_POINTS).ceil());
    let step = step_ms / 1000.0;
    // getRateIntervalScopedVariable.
    let rate_interval_ms = (interval_ms + scrape_ms).max(4 * scrape_ms);
    // alignRange: both ends down to a multiple of the step.
    let aligned = |t: f64| (t / step).floor() * step;
    let range = QueryRange {
        start: aligned(start),
        end: aligned(end),
        step,
    };
    let builtins = Builtins {
        interval_ms,
        rate_interval_ms,
        range_ms: range_ms.round() as u64,
        from_ms: (start * 1000.0).round() as u64,
        to_ms: (end * 1000.0).round() as u64,
    };
    (range, builtins)
}

impl Builtins {
    /// The value of built-in variable `name` (without `$`), as the Prometheus datasource
    /// substitutes it; `None` when it is not one.
    pub fn get(&self, name: &str) -> Option<String> {
        let range_s = (self.range_ms as f64 / 1000.0).round() as u64;
        Some(match name {
            "__interval" => format_interval(self.interval_ms),
            "__interval_ms" => self.interval_ms.to_string(),
            "__rate_interval" => format!("{}ms", self.rate_interval_ms),
            "__rate_interval_ms" => self.rate_interval_ms.to_string(),
            "__range" => format!("{range_s}s"),
            "__range_s" => range_s.to_string(),
            "__range_ms" => self.range_ms.to_string(),
            "__from" => self.from_ms.to_string(),
            "__to" => self.to_ms.to_string(),
            _ => return None,
        })
    }
}

/// A template variable's selected value(s), as chosen from its options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    One(String),
    /// Several values, or All without an `allValue`: a regex alternation.
    Many(Vec<String>),
    /// All with the variable's `allValue`, inserted as it is.
    Custom(String),
}

impl Selected {
    /// The text the Prometheus datasource puts in a query.
    pub fn promql(&self) -> String {
        match self {
            Selected::One(v) => v.replace('\\', "\\\\").replace('"', "\\\""),
            Selected::Many(values) if values.len() == 1 => regex_escape(&values[0]),
            Selected::Many(values) => format!(
                "({})",
                values
                    .iter()
                    .map(|v| regex_escape(v))
                    .collect::<Vec<_>>()
                    .join("|")
            ),
            Selected::Custom(v) => v.clone(),
        }
    }

    /// The values for a report (`All` for a custom all value).
    pub fn display(&self) -> String {
        match self {
            Selected::One(v) => v.clone(),
            Selected::Many(values) => values.join(", "),
            Selected::Custom(v) => format!("All ({v})"),
        }
    }
}

/// The Prometheus datasource's `prometheusSpecialRegexEscape`, inside a label matcher's string.
fn regex_escape(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if "\\^$*+?.()|{}[]".contains(c) {
            // A regex escape, itself escaped for the PromQL string.
            out.push_str("\\\\");
        } else if c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The values a variable selects from its `options` (sorted already), as a dashboard opened
/// fresh selects them: the saved `current` values when they are all options, else All when
/// the variable has it, else the first option.
pub fn select(
    options: &[String],
    current: &[String],
    include_all: bool,
    all_value: Option<&str>,
) -> anyhow::Result<Selected> {
    let all = |values: Vec<String>| match all_value {
        Some(custom) => Selected::Custom(custom.to_owned()),
        None => Selected::Many(values),
    };
    let saved_all = current.iter().any(|c| c == "$__all");
    if saved_all && include_all {
        return Ok(all(options.to_vec()));
    }
    if !current.is_empty() && current.iter().all(|c| options.contains(c)) {
        return Ok(match current {
            [one] => Selected::One(one.clone()),
            many => Selected::Many(many.to_vec()),
        });
    }
    if include_all {
        return Ok(all(options.to_vec()));
    }
    options
        .first()
        .map(|first| Selected::One(first.clone()))
        .context("its query returned no values")
}

/// Sorts a variable's options as Grafana's `sort` option says.
pub fn sort_options(mut options: Vec<String>, sort: u64) -> Vec<String> {
    // Grafana sorts numerically by the first run of digits in the text.
    let number = |s: &String| {
        s.chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<f64>()
            .unwrap_or(f64::NAN)
    };
    match sort {
        1 | 2 => options.sort(),
        3 | 4 => options.sort_by(|a, b| number(a).total_cmp(&number(b))),
        5 | 6 => options.sort_by_key(|s| s.to_lowercase()),
        _ => {}
    }
    if sort > 0 && sort.is_multiple_of(2) {
        options.reverse();
    }
    options.dedup();
    options
}

/// `text` with every `$name`, `${name}`, `${name:format}` and `[[name]]` replaced by
/// `lookup(name)`; a name `lookup` does not know is an error (Grafana would leave it in the
/// query, which then fails or matches nothing).
pub fn interpolate(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(['$', '[']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let (name, used) = if let Some(braced) = tail.strip_prefix("${") {
            let end = braced.find('}').context("an unclosed ${")?;
            let inner = &braced[..end];
            // The format (`${pod:regex}`) does not change a Prometheus query's single value.
            (inner.split(':').next().unwrap_or(inner), end + 3)
        } else if let Some(bracketed) = tail.strip_prefix("[[") {
            match bracketed.find("]]") {
                Some(end) if is_name(&bracketed[..end]) => (&bracketed[..end], end + 4),
                _ => {
                    out.push('[');
                    rest = &tail[1..];
                    continue;
                }
            }
        } else if let Some(named) = tail.strip_prefix('$') {
            let len = named
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(named.len());
            (&named[..len], len + 1)
        } else {
            out.push('[');
            rest = &tail[1..];
            continue;
        };
        if name.is_empty() {
            out.push_str(&tail[..used]);
        } else {
            let value = lookup(name).with_context(|| format!("unknown variable ${name}"))?;
            out.push_str(&value);
        }
        rest = &tail[used..];
    }
    out.push_str(rest);
    Ok(out)
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The legend of a series: `template` with `{{label}}` replaced by the series' label values;
/// `__auto` or an empty template gives the labels as `{a="b"}` (the expression when there are
/// none, as Grafana shows it). Returns the legend and the labels the template names that the
/// series does not have (Grafana draws them as nothing: a dashboard mistake).
pub fn legend(
    template: &str,
    labels: &BTreeMap<String, String>,
    expr: &str,
) -> (String, Vec<String>) {
    if template.is_empty() || template == "__auto" {
        let shown: Vec<String> = labels
            .iter()
            .filter(|(k, _)| k.as_str() != "__name__")
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        let text = if shown.is_empty() {
            expr.to_owned()
        } else {
            format!("{{{}}}", shown.join(", "))
        };
        return (text, Vec::new());
    }
    let mut out = String::new();
    let mut missing = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find("}}") else {
            break;
        };
        let name = rest[open + 2..open + close].trim();
        match labels.get(name) {
            Some(value) => out.push_str(value),
            None => missing.push(name.to_owned()),
        }
        rest = &rest[open + close + 2..];
    }
    out.push_str(rest);
    (out, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_rounded_as_grafana_rounds_them() {
        assert_eq!(round_interval(90.0), 100);
        assert_eq!(round_interval(1_200.0), 1_000);
        assert_eq!(round_interval(4_000.0), 5_000);
        assert_eq!(round_interval(40_000.0), 30_000);
        assert_eq!(round_interval(100_000.0), 120_000);
        assert_eq!(format_interval(120_000), "2m");
        assert_eq!(format_interval(90_000), "90s");
        assert_eq!(format_interval(500), "500ms");
        assert_eq!(parse_duration_ms("15s").unwrap(), 15_000);
        assert_eq!(parse_duration_ms("2m").unwrap(), 120_000);
        assert!(parse_duration_ms("15").is_err());
    }

    #[test]
    fn a_short_window_queries_at_the_scrape_interval_and_rates_over_four_scrapes() {
        // 120 s on a third of the screen (600 points): 0.2 s rounds to 200 ms, below the 1 s
        // scrape interval, so the interval is 1 s and the rate interval 4 scrapes.
        let (range, b) = panel_range(1000.4, 1120.4, 600, None, 1_000);
        assert_eq!(range.step, 1.0);
        assert_eq!((range.start, range.end), (1000.0, 1120.0));
        assert_eq!(b.get("__interval").unwrap(), "1s");
        assert_eq!(b.get("__rate_interval").unwrap(), "4000ms");
        assert_eq!(b.get("__range").unwrap(), "120s");
        assert_eq!(b.get("__range_s").unwrap(), "120");
        assert_eq!(b.get("__from").unwrap(), "1000400");
        assert_eq!(b.get("pod"), None);
    }

    #[test]
    fn a_long_window_queries_at_a_coarser_interval() {
        // An hour over 600 points: 6 s rounds to 5 s; the rate interval is the interval plus
        // one scrape.
        let (range, b) = panel_range(0.0, 3600.0, 600, None, 1_000);
        assert_eq!(range.step, 5.0);
        assert_eq!(b.get("__rate_interval").unwrap(), "6000ms");
        // A panel's own minimum interval wins over a finer one.
        let (range, b) = panel_range(0.0, 3600.0, 600, Some(30_000), 1_000);
        assert_eq!(range.step, 30.0);
        assert_eq!(b.get("__interval").unwrap(), "30s");
    }

    #[test]
    fn variables_are_substituted_in_every_syntax_and_unknown_ones_are_errors() {
        let lookup = |name: &str| match name {
            "namespace" => Some("ns-1".to_owned()),
            "pod" => Some(".*".to_owned()),
            "__rate_interval" => Some("4000ms".to_owned()),
            _ => None,
        };
        let expr = r#"rate(x{namespace="$namespace", pod=~"${pod}"}[$__rate_interval]) + y{a="[[namespace]]"}[5m]"#;
        assert_eq!(
            interpolate(expr, &lookup).unwrap(),
            r#"rate(x{namespace="ns-1", pod=~".*"}[4000ms]) + y{a="ns-1"}[5m]"#
        );
        assert_eq!(
            interpolate("${pod:regex} $ end", &lookup).unwrap(),
            ".* $ end"
        );
        let e = interpolate("x{a=\"$nope\"}", &lookup).unwrap_err();
        assert!(e.to_string().contains("$nope"), "{e}");
    }

    #[test]
    fn a_variable_selects_as_a_fresh_dashboard_does() {
        let options = vec!["a".to_owned(), "b.c".to_owned()];
        assert_eq!(
            select(&options, &[], false, None).unwrap(),
            Selected::One("a".into())
        );
        assert_eq!(
            select(&options, &[], true, Some(".*")).unwrap(),
            Selected::Custom(".*".into())
        );
        let all = select(&options, &[], true, None).unwrap();
        assert_eq!(all.promql(), r"(a|b\\.c)");
        assert_eq!(
            select(&options, &["b.c".to_owned()], true, None).unwrap(),
            Selected::One("b.c".into())
        );
        // A saved value that is gone falls back.
        assert_eq!(
            select(&options, &["gone".to_owned()], false, None).unwrap(),
            Selected::One("a".into())
        );
        assert!(select(&[], &[], false, None).is_err());
        assert_eq!(
            sort_options(vec!["b".into(), "a".into(), "b".into()], 2),
            ["b", "a"]
        );
        assert_eq!(
            sort_options(vec!["mm-10".into(), "mm-9".into()], 3),
            ["mm-9", "mm-10"]
        );
    }

    #[test]
    fn legends_fill_labels_and_name_the_missing_ones() {
        let labels = BTreeMap::from([("pod".to_owned(), "mm-0".to_owned())]);
        assert_eq!(
            legend("{{pod}} draining", &labels, "e"),
            ("mm-0 draining".to_owned(), vec![])
        );
        assert_eq!(
            legend("{{ version }}", &labels, "e"),
            (String::new(), vec!["version".to_owned()])
        );
        assert_eq!(legend("__auto", &labels, "e").0, "{pod=\"mm-0\"}");
        assert_eq!(legend("", &BTreeMap::new(), "sum(x)").0, "sum(x)");
    }
}
