//! Chart versions and version constraints as Helm reads them.
//!
//! Helm resolves `--version` against a repository's `index.yaml` with the Go library
//! Masterminds/semver v3: an exact string match first, else the highest version that satisfies
//! the constraint (`helm.sh/helm/v4/pkg/repo` `IndexFile.Get`, `pkg/registry`
//! `GetTagMatchingVersionOrConstraint`). Versions are compared with the `semver` crate (SemVer 2
//! precedence, build metadata ignored, as Masterminds' `Compare` does); the constraint language is
//! parsed here because the `semver` crate's `VersionReq` reads it differently:
//!
//! | constraint | Masterminds (Helm), implemented here | `semver::VersionReq` |
//! |---|---|---|
//! | `1.2.3` | exactly 1.2.3 | `^1.2.3` |
//! | `1.2`, `1.2.x`, `=1.2` | `>=1.2.0 <1.3.0` | `^1.2` / `=1.2` |
//! | `>=1.0 <2.0` | space or comma = and | comma only |
//! | `^1 \|\| ^2` | or | not supported |
//! | `1.2 - 1.4.5` | `>=1.2 <=1.4.5` | not supported |
//! | prereleases | allowed by a term only when that term's version names one (each term of a group must allow it) | only of the same `major.minor.patch` |
//!
//! Other rules (Masterminds v3): `~1.2.3` is `>=1.2.3 <1.3.0`, `~1` is `>=1 <2`; `^1.2.3` is
//! `>=1.2.3 <2.0.0`, `^0.2.3` is `>=0.2.3 <0.3.0`, `^0.0.3` is `>=0.0.3 <0.0.4`; `>1.2` is
//! `>=1.3.0` and `<=1.2` is `<1.3.0` (a wildcard widens the bound); `*`, `x` and an empty
//! constraint match every release. Versions may be written with a leading `v` and with minor and
//! patch left out (`v1.2` is 1.2.0), as Masterminds' lenient parser accepts.

use std::cmp::Ordering;

use semver::{BuildMetadata, Prerelease, Version};

/// Most characters of a constraint (the CRD allows 128).
const MAX_CONSTRAINT: usize = 256;

/// Parses a version leniently: an optional leading `v`, one to three numeric parts (missing ones
/// are 0), then an optional `-prerelease` and `+build`.
pub fn parse_version(text: &str) -> Option<Version> {
    let text = text.trim();
    let text = text.strip_prefix(['v', 'V']).unwrap_or(text);
    let (rest, build) = match text.split_once('+') {
        Some((_, "")) => return None,
        Some((rest, build)) => (rest, BuildMetadata::new(build).ok()?),
        None => (text, BuildMetadata::EMPTY),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((_, "")) => return None,
        Some((core, pre)) => (core, Prerelease::new(pre).ok()?),
        None => (rest, Prerelease::EMPTY),
    };
    let mut parts = [0u64; 3];
    for (i, part) in core.split('.').enumerate() {
        if i == 3 || part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        parts[i] = part.parse().ok()?;
    }
    Some(Version {
        major: parts[0],
        minor: parts[1],
        patch: parts[2],
        pre,
        build,
    })
}

/// An operator of one constraint term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `=` or none: equal, or a tilde range when the version has wildcards.
    Equal,
    NotEqual,
    Greater,
    Less,
    GreaterEqual,
    LessEqual,
    Tilde,
    Caret,
}

/// One term, e.g. `>=1.2` (minor given, patch a wildcard).
#[derive(Clone, Debug, PartialEq)]
struct Term {
    op: Op,
    /// The version with wildcards and missing parts as 0.
    version: Version,
    /// The major part is a wildcard (`*`, `x`) or missing.
    any_major: bool,
    /// The minor part is a wildcard or missing.
    any_minor: bool,
    /// The patch part is a wildcard or missing.
    any_patch: bool,
}

/// A version constraint: `||`-separated groups of terms that must all hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Constraint {
    groups: Vec<Vec<Term>>,
}

impl Constraint {
    /// Parses a constraint in Masterminds' syntax; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_CONSTRAINT {
            return Err(format!("longer than {MAX_CONSTRAINT} characters"));
        }
        let groups = text
            .split("||")
            .map(parse_group)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { groups })
    }

    /// Whether `version` satisfies the constraint: every term of some group does.
    pub fn matches(&self, version: &Version) -> bool {
        self.groups.iter().any(|group| {
            group
                .iter()
                .all(|term| term.admits_prerelease(version) && term.matches(version))
        })
    }
}

fn parse_group(text: &str) -> Result<Vec<Term>, String> {
    let tokens: Vec<&str> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.is_empty() {
        // An empty constraint (or group) matches any release, as `*` does.
        return Ok(vec![parse_term("*")?]);
    }
    let mut terms = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let mut token = tokens[i].to_owned();
        // An operator separated from its version by spaces: `>= 1.2`.
        if token.chars().all(|c| "=!<>~^".contains(c)) {
            let version = tokens
                .get(i + 1)
                .ok_or_else(|| format!("operator {token:?} without a version"))?;
            token.push_str(version);
            i += 1;
        }
        // A hyphen range: `1.2 - 1.4.5` is `>=1.2 <=1.4.5`.
        if tokens.get(i + 1) == Some(&"-") {
            let upper = tokens
                .get(i + 2)
                .ok_or_else(|| format!("range {token:?} - without an upper bound"))?;
            if token.starts_with(|c: char| "=!<>~^".contains(c))
                || upper.starts_with(|c: char| "=!<>~^".contains(c))
            {
                return Err(format!("a range {token} - {upper} takes plain versions"));
            }
            terms.push(parse_term(&format!(">={token}"))?);
            terms.push(parse_term(&format!("<={upper}"))?);
            i += 3;
            continue;
        }
        terms.push(parse_term(&token)?);
        i += 1;
    }
    Ok(terms)
}

fn parse_term(text: &str) -> Result<Term, String> {
    let split = text
        .find(|c: char| !"=!<>~^".contains(c))
        .ok_or_else(|| format!("{text:?} has no version"))?;
    let (op, version) = text.split_at(split);
    let op = match op {
        "" | "=" => Op::Equal,
        "!=" => Op::NotEqual,
        ">" => Op::Greater,
        "<" => Op::Less,
        ">=" | "=>" => Op::GreaterEqual,
        "<=" | "=<" => Op::LessEqual,
        "~" | "~>" => Op::Tilde,
        "^" => Op::Caret,
        other => return Err(format!("unknown operator {other:?} in {text:?}")),
    };
    let bad = || format!("{text:?} is not a version constraint");
    let version = version.strip_prefix(['v', 'V']).unwrap_or(version);
    let (rest, build) = match version.split_once('+') {
        Some((_, "")) => return Err(bad()),
        Some((rest, build)) => (rest, BuildMetadata::new(build).map_err(|_| bad())?),
        None => (version, BuildMetadata::EMPTY),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((_, "")) => return Err(bad()),
        Some((core, pre)) => (core, Prerelease::new(pre).map_err(|_| bad())?),
        None => (rest, Prerelease::EMPTY),
    };
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() > 3 {
        return Err(bad());
    }
    let wildcard = |p: Option<&&str>| p.is_none_or(|p| matches!(*p, "x" | "X" | "*"));
    let number = |p: Option<&&str>| -> Result<u64, String> {
        match p {
            Some(p) if !wildcard(Some(p)) => {
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                p.parse().map_err(|_| bad())
            }
            _ => Ok(0),
        }
    };
    let any_major = wildcard(parts.first());
    let any_minor = any_major || wildcard(parts.get(1));
    let any_patch = any_minor || wildcard(parts.get(2));
    Ok(Term {
        op,
        version: Version {
            major: if any_major { 0 } else { number(parts.first())? },
            minor: if any_minor { 0 } else { number(parts.get(1))? },
            patch: if any_patch { 0 } else { number(parts.get(2))? },
            pre,
            build,
        },
        any_major,
        any_minor,
        any_patch,
    })
}

impl Term {
    /// Masterminds v3 checks prereleases per term: a term refuses a prerelease unless its own
    /// version has one (an exact `!=` excepted), so `>=2.0.0-0 <3` admits no prerelease at all
    /// (`<3` refuses them) and picks 2.1.0, not 3.0.0-rc.1.
    fn admits_prerelease(&self, v: &Version) -> bool {
        v.pre.is_empty()
            || !self.version.pre.is_empty()
            || (self.op == Op::NotEqual && !self.any_patch)
    }

    fn matches(&self, v: &Version) -> bool {
        let c = &self.version;
        let cmp = v.cmp_precedence(c);
        let wild = self.any_patch; // some part is a wildcard (patch is when minor or major is)
        if self.any_major {
            // `*`, `x`: every release; `!=*` none, `<*` none.
            return !matches!(self.op, Op::NotEqual | Op::Less);
        }
        match self.op {
            Op::Equal if wild => self.tilde(v),
            Op::Equal => cmp == Ordering::Equal,
            Op::NotEqual if wild => !self.tilde(v),
            Op::NotEqual => cmp != Ordering::Equal,
            // `>1.2` is past the whole 1.2 range; `>1` past all of 1.
            Op::Greater if self.any_minor => v.major > c.major,
            Op::Greater if wild => (v.major, v.minor) > (c.major, c.minor),
            Op::Greater => cmp == Ordering::Greater,
            Op::Less => cmp == Ordering::Less,
            Op::GreaterEqual => cmp != Ordering::Less,
            // `<=1.2` includes the whole 1.2 range.
            Op::LessEqual if self.any_minor => v.major <= c.major,
            Op::LessEqual if wild => (v.major, v.minor) <= (c.major, c.minor),
            Op::LessEqual => cmp != Ordering::Greater,
            Op::Tilde => self.tilde(v),
            Op::Caret => self.caret(v),
        }
    }

    /// `~1.2.3` = `>=1.2.3 <1.3.0`; `~1` = `>=1.0.0 <2.0.0`.
    fn tilde(&self, v: &Version) -> bool {
        let c = &self.version;
        v.cmp_precedence(c) != Ordering::Less
            && v.major == c.major
            && (self.any_minor || v.minor == c.minor)
    }

    /// `^1.2.3` = `>=1.2.3 <2`; `^0.2.3` = `>=0.2.3 <0.3`; `^0.0.3` = `>=0.0.3 <0.0.4`;
    /// `^0` = `<1`; `^0.0` = `<0.1`.
    fn caret(&self, v: &Version) -> bool {
        let c = &self.version;
        if v.cmp_precedence(c) == Ordering::Less || v.major != c.major {
            return false;
        }
        if c.major > 0 || self.any_minor {
            return true;
        }
        if v.minor != c.minor {
            return false;
        }
        c.minor > 0 || self.any_patch || v.patch == c.patch
    }
}

/// Picks the version Helm would: the candidate equal to `requested` as a string, else the
/// highest one (by SemVer precedence) that satisfies `requested` as a constraint. Candidates that
/// are not versions are skipped. `Ok(None)`: nothing matches.
pub fn select<'a>(
    requested: &str,
    candidates: impl IntoIterator<Item = &'a str> + Clone,
) -> Result<Option<&'a str>, String> {
    if let Some(exact) = candidates.clone().into_iter().find(|c| *c == requested) {
        return Ok(Some(exact));
    }
    let constraint = Constraint::parse(requested)?;
    Ok(candidates
        .into_iter()
        .filter_map(|c| Some((parse_version(c)?, c)))
        .filter(|(v, _)| constraint.matches(v))
        .max_by(|(a, _), (b, _)| a.cmp_precedence(b))
        .map(|(_, c)| c))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERSIONS: &[&str] = &[
        "0.0.3",
        "0.0.4",
        "0.2.3",
        "0.2.9",
        "0.3.0",
        "1.0.0",
        "1.2.0",
        "1.2.3",
        "1.2.9",
        "1.3.0",
        "1.4.5",
        "1.4.6",
        "2.0.0-beta.1",
        "2.0.0",
        "2.1.0+build.7",
        "3.0.0-rc.1",
    ];

    fn pick(constraint: &str) -> Option<&'static str> {
        select(constraint, VERSIONS.iter().copied()).unwrap()
    }

    fn all(constraint: &str) -> Vec<&'static str> {
        let c = Constraint::parse(constraint).unwrap();
        VERSIONS
            .iter()
            .copied()
            .filter(|v| c.matches(&parse_version(v).unwrap()))
            .collect()
    }

    #[test]
    fn exact_versions_and_their_shorthands() {
        assert_eq!(pick("1.2.3"), Some("1.2.3"));
        assert_eq!(pick("=1.2.3"), Some("1.2.3"));
        assert_eq!(pick("v1.2.3"), Some("1.2.3"));
        assert_eq!(
            all("1.2.3"),
            ["1.2.3"],
            "a bare version is exact, not ^1.2.3"
        );
        // A partial version is a tilde range, as in Masterminds.
        assert_eq!(all("1.2"), ["1.2.0", "1.2.3", "1.2.9"]);
        assert_eq!(all("1.2.x"), ["1.2.0", "1.2.3", "1.2.9"]);
        assert_eq!(pick("1"), Some("1.4.6"));
        assert_eq!(pick("1.x"), Some("1.4.6"));
        assert_eq!(pick("9.9.9"), None);
        // An exact string match wins even for a prerelease.
        assert_eq!(pick("3.0.0-rc.1"), Some("3.0.0-rc.1"));
        assert_eq!(pick("2.1.0+build.7"), Some("2.1.0+build.7"));
    }

    #[test]
    fn tilde_and_caret() {
        assert_eq!(all("~1.2.3"), ["1.2.3", "1.2.9"]);
        assert_eq!(all("~>1.2"), ["1.2.0", "1.2.3", "1.2.9"]);
        assert_eq!(pick("~1"), Some("1.4.6"));
        assert_eq!(pick("^1.2"), Some("1.4.6"));
        assert_eq!(all("^1.2.3"), ["1.2.3", "1.2.9", "1.3.0", "1.4.5", "1.4.6"]);
        assert_eq!(all("^0.2.3"), ["0.2.3", "0.2.9"]);
        assert_eq!(all("^0.0.3"), ["0.0.3"]);
        assert_eq!(all("^0"), ["0.0.3", "0.0.4", "0.2.3", "0.2.9", "0.3.0"]);
        assert_eq!(all("^0.0"), ["0.0.3", "0.0.4"]);
        assert_eq!(pick("^2"), Some("2.1.0+build.7"));
    }

    #[test]
    fn comparisons_ranges_and_alternatives() {
        assert_eq!(pick(">=1.0 <2.0"), Some("1.4.6"));
        assert_eq!(pick(">= 1.0, < 2.0"), Some("1.4.6"));
        assert_eq!(all(">1.2.9 <=1.4.5"), ["1.3.0", "1.4.5"]);
        assert_eq!(
            all(">1.2 <2"),
            ["1.3.0", "1.4.5", "1.4.6"],
            ">1.2 skips all 1.2.x"
        );
        assert_eq!(all("<=1.2 >=1"), ["1.0.0", "1.2.0", "1.2.3", "1.2.9"]);
        assert_eq!(all(">1 <=2"), ["2.0.0", "2.1.0+build.7"]);
        assert_eq!(all("1.2.3 - 1.4.5"), ["1.2.3", "1.2.9", "1.3.0", "1.4.5"]);
        assert_eq!(all("^0.2 || 1.4.x"), ["0.2.3", "0.2.9", "1.4.5", "1.4.6"]);
        assert_eq!(all("!=1.2.3 ~1.2"), ["1.2.0", "1.2.9"]);
        assert_eq!(all("!=1.x >=0.3"), ["0.3.0", "2.0.0", "2.1.0+build.7"]);
        assert_eq!(pick("*"), Some("2.1.0+build.7"));
        assert_eq!(pick("x"), Some("2.1.0+build.7"));
        assert_eq!(pick(""), Some("2.1.0+build.7"));
        assert_eq!(pick("<0.0.1"), None);
    }

    #[test]
    fn prereleases_only_when_asked_for() {
        assert!(!all(">=2.0.0").contains(&"3.0.0-rc.1"));
        assert!(!all("*").contains(&"2.0.0-beta.1"));
        assert_eq!(pick(">=3.0.0-0"), Some("3.0.0-rc.1"));
        // Each term decides for itself (Masterminds v3): `<3` names no prerelease, so it
        // refuses all of them, even though 3.0.0-rc.1 is below 3.0.0. Helm picks 2.1.0.
        assert_eq!(all(">=2.0.0-0 <3"), ["2.0.0", "2.1.0+build.7"]);
        assert_eq!(pick(">=2.0.0-0 <3"), Some("2.1.0+build.7"));
        assert_eq!(
            all(">=2.0.0-0 <3.0.0-0"),
            ["2.0.0-beta.1", "2.0.0", "2.1.0+build.7"]
        );
        assert_eq!(
            all(">=2.0.0-0 !=2.0.0"),
            ["2.0.0-beta.1", "2.1.0+build.7", "3.0.0-rc.1"]
        );
        assert!(!all(">=2.0.0-0 !=1.x").contains(&"3.0.0-rc.1"));
        assert_eq!(
            all("2.0.0-beta.1 || ^1.4"),
            ["1.4.5", "1.4.6", "2.0.0-beta.1"]
        );
        assert_eq!(pick("~2.0.0-alpha"), Some("2.0.0"));
    }

    #[test]
    fn bad_constraints_say_what_is_wrong() {
        for (bad, expected) in [
            ("foo", "\"foo\" is not a version constraint"),
            (">=", "operator \">=\" without a version"),
            ("1.2.3.4", "\"1.2.3.4\" is not a version constraint"),
            ("=>>1", "unknown operator \"=>>\" in \"=>>1\""),
            ("1.2 -", "range \"1.2\" - without an upper bound"),
            ("^1.a", "\"^1.a\" is not a version constraint"),
            ("~> ", "operator \"~>\" without a version"),
            ("1.2 - >3", "a range 1.2 - >3 takes plain versions"),
        ] {
            assert_eq!(Constraint::parse(bad).unwrap_err(), expected, "{bad}");
        }
        assert_eq!(
            select("not-a-version", ["1.0.0"]).unwrap_err(),
            "\"not-a-version\" is not a version constraint"
        );
        assert!(Constraint::parse(&"1".repeat(300)).is_err());
    }

    #[test]
    fn lenient_versions_and_unparseable_candidates() {
        assert_eq!(parse_version("v1.2"), Some(Version::new(1, 2, 0)));
        assert_eq!(parse_version("1"), Some(Version::new(1, 0, 0)));
        assert_eq!(parse_version("1.2.3.4"), None);
        assert_eq!(parse_version("latest"), None);
        assert_eq!(parse_version("1.2.3-"), None);
        assert_eq!(
            select("^1", ["latest", "1.0.0", "1.1.0", "garbage"]).unwrap(),
            Some("1.1.0")
        );
    }
}
