//! Prometheus' HTTP API on the loopback (`/api/v1/…`): range and instant queries, label
//! values, the rules' state. The answers' parsing is pure; the requests are HTTP/1.0 GETs
//! through [`test_support::fleet::http_get`].

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use serde_json::Value;
use test_support::fleet::http_get;

use super::grafana::QueryRange;

/// One series of a query's answer: its labels and its points (Unix seconds, value; NaN and
/// infinities kept as Prometheus sent them).
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

/// A rule as `/api/v1/rules` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub group: String,
    pub name: String,
    /// `ok`, `err` or `unknown` (not evaluated yet).
    pub health: String,
    pub last_error: String,
    /// Alerting rules: `inactive`, `pending` or `firing`.
    pub state: String,
}

/// The API of the Prometheus listening on `127.0.0.1:port`.
#[derive(Clone, Copy, Debug)]
pub struct Api {
    pub port: u16,
}

impl Api {
    async fn get(&self, path: &str, params: &[(&str, String)]) -> anyhow::Result<Value> {
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        let url = format!("{path}?{}", query.join("&"));
        let (status, body) = http_get(self.port, &url)
            .await
            .with_context(|| format!("GET {path} from Prometheus"))?;
        let json: Value = serde_json::from_str(&body)
            .with_context(|| format!("GET {path}: HTTP {status}, not JSON: {}", short(&body)))?;
        if json["status"] != "success" {
            bail!(
                "GET {path}: HTTP {status}, {}: {}",
                json["errorType"].as_str().unwrap_or("error"),
                json["error"].as_str().unwrap_or_default()
            );
        }
        Ok(json["data"].clone())
    }

    /// Whether the server answers `/-/ready` with 200.
    pub async fn ready(&self) -> bool {
        matches!(http_get(self.port, "/-/ready").await, Ok((200, _)))
    }

    /// `query_range` of `expr` over `range`.
    pub async fn query_range(&self, expr: &str, range: QueryRange) -> anyhow::Result<Vec<Series>> {
        let data = self
            .get(
                "/api/v1/query_range",
                &[
                    ("query", expr.to_owned()),
                    ("start", format!("{:.3}", range.start)),
                    ("end", format!("{:.3}", range.end)),
                    ("step", format!("{}", range.step)),
                ],
            )
            .await?;
        parse_result(&data)
    }

    /// An instant query of `expr` at `time`.
    pub async fn query(&self, expr: &str, time: f64) -> anyhow::Result<Vec<Series>> {
        let data = self
            .get(
                "/api/v1/query",
                &[("query", expr.to_owned()), ("time", format!("{time:.3}"))],
            )
            .await?;
        parse_result(&data)
    }

    /// The values of `label` on the series `matcher` selects (all series when empty) in
    /// `[start, end]`.
    pub async fn label_values(
        &self,
        label: &str,
        matcher: &str,
        start: f64,
        end: f64,
    ) -> anyhow::Result<Vec<String>> {
        let mut params = vec![
            ("start", format!("{start:.3}")),
            ("end", format!("{end:.3}")),
        ];
        if !matcher.is_empty() {
            params.push(("match[]", matcher.to_owned()));
        }
        let data = self
            .get(&format!("/api/v1/label/{}/values", encode(label)), &params)
            .await?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect())
    }

    /// Every rule loaded, with its health and (alerts) state.
    pub async fn rules(&self) -> anyhow::Result<Vec<Rule>> {
        Ok(parse_rules(&self.get("/api/v1/rules", &[]).await?))
    }
}

/// Percent-encoding of a query parameter (RFC 3986 unreserved characters kept).
pub fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn short(text: &str) -> String {
    text.chars().take(200).collect()
}

/// The series of a `matrix` or `vector` answer (`data` of the API's envelope).
pub fn parse_result(data: &Value) -> anyhow::Result<Vec<Series>> {
    let kind = data["resultType"].as_str().unwrap_or_default();
    let point = |p: &Value| -> Option<(f64, f64)> {
        let t = p.get(0)?.as_f64()?;
        let v = p.get(1)?.as_str()?.parse::<f64>().ok()?;
        Some((t, v))
    };
    let results = data["result"].as_array().context("no `result` array")?;
    results
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            let points = match kind {
                "matrix" => r["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(point)
                    .collect(),
                "vector" => point(&r["value"]).into_iter().collect(),
                other => bail!("result type {other:?}: expected a matrix or a vector"),
            };
            Ok(Series { labels, points })
        })
        .collect()
}

/// The rules of `/api/v1/rules`' `data`.
pub fn parse_rules(data: &Value) -> Vec<Rule> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    data["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| {
            let name = text(&group["name"]);
            group["rules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |rule| Rule {
                    group: name.clone(),
                    name: text(&rule["name"]),
                    health: text(&rule["health"]),
                    last_error: text(&rule["lastError"]),
                    state: text(&rule["state"]),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matrices_and_vectors_parse_with_nan_kept() {
        let matrix = json!({"resultType": "matrix", "result": [
            {"metric": {"pod": "mm-0"}, "values": [[10, "1.5"], [11, "NaN"], [12, "+Inf"]]}
        ]});
        let series = parse_result(&matrix).unwrap();
        assert_eq!(series[0].labels["pod"], "mm-0");
        assert_eq!(series[0].points[0], (10.0, 1.5));
        assert!(series[0].points[1].1.is_nan());
        assert_eq!(series[0].points[2].1, f64::INFINITY);
        let vector = json!({"resultType": "vector", "result": [
            {"metric": {"alertname": "A"}, "value": [5.5, "3"]}
        ]});
        assert_eq!(parse_result(&vector).unwrap()[0].points, [(5.5, 3.0)]);
        // A scalar (`1 + 1`) is no series a panel could draw.
        assert!(parse_result(&json!({"resultType": "scalar", "result": [1, "2"]})).is_err());
        assert!(parse_result(&json!({"resultType": "string"})).is_err());
    }

    #[test]
    fn rules_parse_with_their_group_health_and_state() {
        let data = json!({"groups": [{"name": "g", "rules": [
            {"name": "A", "type": "alerting", "health": "ok", "state": "firing", "lastError": ""},
            {"name": "B", "type": "alerting", "health": "err", "lastError": "bad"}
        ]}]});
        let rules = parse_rules(&data);
        assert_eq!(rules.len(), 2);
        assert_eq!(
            (rules[0].group.as_str(), rules[0].state.as_str()),
            ("g", "firing")
        );
        assert_eq!(rules[1].last_error, "bad");
    }

    #[test]
    fn parameters_are_percent_encoded() {
        assert_eq!(
            encode(r#"sum(x{a="b"}[1m])"#),
            "sum%28x%7Ba%3D%22b%22%7D%5B1m%5D%29"
        );
        assert_eq!(encode("a b+c"), "a%20b%2Bc");
    }
}
