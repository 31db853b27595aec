//! Pure arithmetic over what the harness observed: quantiles of durations, quantiles from
//! Prometheus histogram buckets, sums and differences of scraped samples.

use std::collections::BTreeMap;

use crate::results::Quantiles;

/// Nearest-rank quantiles of `values` (seconds, any order).
pub fn quantiles(values: &[f64]) -> Quantiles {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| -> Option<f64> {
        if sorted.is_empty() {
            return None;
        }
        let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
        Some(sorted[rank.min(sorted.len()) - 1])
    };
    Quantiles {
        count: sorted.len() as u64,
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: sorted.last().copied(),
    }
}

/// One sample of the Prometheus text exposition: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct PromSample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the classic text format (0.0.4) and OpenMetrics sample lines; comments and lines
/// that do not parse are skipped.
pub fn parse_prometheus(text: &str) -> Vec<PromSample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<PromSample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        None => {
            let space = line.find(' ')?;
            (&line[..space], BTreeMap::new(), &line[space..])
        }
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(PromSample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key.trim().to_owned(), value);
    }
}

/// Sum of the samples named `name` whose labels include every pair of `matching`.
pub fn sum(samples: &[PromSample], name: &str, matching: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            matching
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Sums of `name` grouped by the value of `label`.
pub fn sum_by(samples: &[PromSample], name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name) {
        let key = s.labels.get(label).cloned().unwrap_or_default();
        *sums.entry(key).or_insert(0.0) += s.value;
    }
    sums
}

/// Cumulative bucket counts of histogram `name` (`<name>_bucket`), summed over label sets:
/// (upper bound, count), ascending, `+Inf` last.
pub fn histogram(samples: &[PromSample], name: &str) -> Vec<(f64, f64)> {
    let bucket = format!("{name}_bucket");
    let mut by_bound: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == bucket) {
        let Some(le) = s.labels.get("le") else {
            continue;
        };
        let bound = match le.as_str() {
            "+Inf" => f64::INFINITY,
            v => match v.parse::<f64>() {
                Ok(b) => b,
                Err(_) => continue,
            },
        };
        by_bound.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += s.value;
    }
    let mut buckets: Vec<(f64, f64)> = by_bound.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// `after − before`, bucket by bucket (the observations between two scrapes). A bucket missing
/// in `before` counts as zero; a counter that went down (process restart) counts from zero.
pub fn histogram_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|(bound, count)| {
            let earlier = before
                .iter()
                .find(|(b, _)| b.to_bits() == bound.to_bits())
                .map_or(0.0, |(_, c)| *c);
            let delta = if *count >= earlier {
                count - earlier
            } else {
                *count
            };
            (*bound, delta)
        })
        .collect()
}

/// Quantile `q` of cumulative buckets, interpolated linearly inside the bucket as Prometheus'
/// `histogram_quantile` does; `None` without observations. Falls in `+Inf`: the highest finite
/// bound.
pub fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower_bound = 0.0;
    let mut lower_count = 0.0;
    for (bound, count) in buckets {
        if *count >= rank {
            if bound.is_infinite() {
                return Some(lower_bound);
            }
            let in_bucket = count - lower_count;
            if in_bucket <= 0.0 {
                return Some(*bound);
            }
            return Some(lower_bound + (bound - lower_bound) * (rank - lower_count) / in_bucket);
        }
        lower_bound = *bound;
        lower_count = *count;
    }
    Some(lower_bound)
}

/// Quantiles from cumulative buckets; `max` is the upper bound of the highest non-empty bucket.
pub fn histogram_quantiles(buckets: &[(f64, f64)]) -> Quantiles {
    let count = buckets.last().map_or(0.0, |b| b.1);
    let mut max = None;
    let mut previous = 0.0;
    for (bound, c) in buckets {
        if *c > previous {
            max = Some(if bound.is_finite() { *bound } else { f64::MAX });
        }
        previous = *c;
    }
    Quantiles {
        count: count as u64,
        p50: histogram_quantile(buckets, 0.50),
        p90: histogram_quantile(buckets, 0.90),
        p99: histogram_quantile(buckets, 0.99),
        max: max.filter(|m| *m < f64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let q = quantiles(&values);
        assert_eq!(q.count, 100);
        assert_eq!(q.p50, Some(50.0));
        assert_eq!(q.p90, Some(90.0));
        assert_eq!(q.p99, Some(99.0));
        assert_eq!(q.max, Some(100.0));
        assert_eq!(quantiles(&[]).p99, None);
        assert_eq!(quantiles(&[3.0]).p50, Some(3.0));
    }

    #[test]
    fn parses_both_text_formats() {
        let text = "# HELP x_total help\n# TYPE x_total counter\n\
                    x_total{result=\"ok\",category=\"a,b\"} 3\n\
                    x_total{result=\"error\"} 2.5e0 1700000000\n\
                    plain 7\nbroken{ 1\n";
        let samples = parse_prometheus(text);
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].labels["category"], "a,b");
        assert_eq!(sum(&samples, "x_total", &[]), 5.5);
        assert_eq!(sum(&samples, "x_total", &[("result", "ok")]), 3.0);
        assert_eq!(sum(&samples, "plain", &[]), 7.0);
        assert_eq!(sum_by(&samples, "x_total", "result")["error"], 2.5);
    }

    #[test]
    fn histogram_quantile_interpolates_like_prometheus() {
        // 10 observations ≤ 0.1, 90 in (0.1, 1], none above.
        let text = "h_bucket{le=\"0.1\"} 10\nh_bucket{le=\"1\"} 100\nh_bucket{le=\"+Inf\"} 100\n";
        let buckets = histogram(&parse_prometheus(text), "h");
        assert_eq!(buckets.len(), 3);
        let p50 = histogram_quantile(&buckets, 0.5).unwrap();
        assert!((p50 - 0.5).abs() < 1e-9, "{p50}");
        assert!((histogram_quantile(&buckets, 0.05).unwrap() - 0.05).abs() < 1e-9);
        let q = histogram_quantiles(&buckets);
        assert_eq!(q.count, 100);
        assert_eq!(q.max, Some(1.0));
        assert_eq!(
            histogram_quantile(&[(1.0, 0.0), (f64::INFINITY, 0.0)], 0.5),
            None
        );
    }

    #[test]
    fn histograms_sum_over_replicas_and_subtract_scrapes() {
        let a = "h_bucket{le=\"1\",r=\"a\"} 1\nh_bucket{le=\"+Inf\",r=\"a\"} 2\n\
                 h_bucket{le=\"1\",r=\"b\"} 3\nh_bucket{le=\"+Inf\",r=\"b\"} 3\n";
        let before = histogram(&parse_prometheus(a), "h");
        assert_eq!(before, vec![(1.0, 4.0), (f64::INFINITY, 5.0)]);
        let after = vec![(1.0, 6.0), (f64::INFINITY, 9.0)];
        assert_eq!(
            histogram_delta(&before, &after),
            vec![(1.0, 2.0), (f64::INFINITY, 4.0)]
        );
        // A restarted process: its counters start again below the earlier value.
        assert_eq!(
            histogram_delta(&[(1.0, 5.0)], &[(1.0, 2.0)]),
            vec![(1.0, 2.0)]
        );
        // Everything above the highest finite bound: that bound.
        assert_eq!(
            histogram_quantile(&[(1.0, 0.0), (f64::INFINITY, 4.0)], 0.99),
            Some(1.0)
        );
    }
}
