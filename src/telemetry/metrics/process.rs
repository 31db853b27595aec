//! Process metrics read from `/proc/self` at scrape time: the standard `process_…` series.
//!
//! [`ProcessCollector`] exports what the Prometheus client libraries call the process collector
//! (client_golang's names and meanings), so that a load test or a dashboard reads each replica's
//! CPU and memory from its `/metrics`, in a cluster as on a laptop. [`HelmCpuCollector`] exports
//! the CPU of the finished child processes: helm runs are module-manager's only children, and
//! their CPU is not in `process_cpu_seconds_total` (the process itself only, by convention).
//!
//! Nothing runs in the background: each scrape reads the files anew. On another system than
//! Linux, or when a file cannot be read or parsed, the affected metrics are left out of the
//! exposition, silently (a scrape every few seconds must not fill the log).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The standard process metrics, by client_golang's names: `process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
/// `process_start_time_seconds`, `process_open_fds`, `process_max_fds`. Register it in the
/// unprefixed root registry: the names are the same for every program.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = os::read("/proc/self/stat").and_then(|text| Stat::parse(&text));
        let ticks = os::clock_ticks_per_second();
        if let (Some(stat), Some(ticks)) = (stat, ticks) {
            encode(
                &mut encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                ConstCounter::new(stat.cpu_ticks() as f64 / ticks as f64),
            )?;
        }
        if let (Some(stat), Some(page_size)) = (stat, os::page_size()) {
            encode(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                ConstGauge::new(stat.resident_pages.saturating_mul(page_size)),
            )?;
        }
        if let Some(stat) = stat {
            encode(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                ConstGauge::new(stat.virtual_bytes),
            )?;
        }
        let boot_time = os::read("/proc/stat").and_then(|text| parse_boot_time(&text));
        if let (Some(stat), Some(ticks), Some(boot_time)) = (stat, ticks, boot_time) {
            encode(
                &mut encoder,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                ConstGauge::new(boot_time as f64 + stat.start_ticks as f64 / ticks as f64),
            )?;
        }
        if let Some(open) = os::open_fds() {
            encode(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                ConstGauge::new(open),
            )?;
        }
        let max_fds = os::read("/proc/self/limits").and_then(|text| parse_max_open_files(&text));
        if let Some(max) = max_fds {
            encode(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                ConstGauge::new(max),
            )?;
        }
        Ok(())
    }
}

/// `helm_cpu_seconds_total`: the CPU of the finished child processes (`cutime` + `cstime` of
/// `/proc/self/stat`), which are helm runs. Register it in the `module_manager` registry.
#[derive(Debug, Default)]
pub struct HelmCpuCollector;

impl Collector for HelmCpuCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = os::read("/proc/self/stat").and_then(|text| Stat::parse(&text));
        if let (Some(stat), Some(ticks)) = (stat, os::clock_ticks_per_second()) {
            encode(
                &mut encoder,
                "helm_cpu_seconds",
                "Total user and system CPU time in seconds of the finished child processes, \
                 which are the helm runs (module-manager starts no other): cutime+cstime of \
                 /proc/self/stat, counted when helm exits; not in process_cpu_seconds_total",
                ConstCounter::new(stat.children_cpu_ticks() as f64 / ticks as f64),
            )?;
        }
        Ok(())
    }
}

/// Encodes one metric without labels.
fn encode(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// The fields of `/proc/<pid>/stat` (proc(5)) the metrics use, in the kernel's units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    /// User CPU of the process (field 14), in clock ticks.
    pub utime: u64,
    /// System CPU of the process (15), in clock ticks.
    pub stime: u64,
    /// User CPU of its waited-for children (16), in clock ticks.
    pub cutime: u64,
    /// System CPU of its waited-for children (17), in clock ticks.
    pub cstime: u64,
    /// Start time (22), in clock ticks after boot.
    pub start_ticks: u64,
    /// Virtual memory size (23), in bytes.
    pub virtual_bytes: u64,
    /// Resident set size (24), in pages.
    pub resident_pages: u64,
}

impl Stat {
    /// Parses the line of `/proc/<pid>/stat`. The command name (field 2, in parentheses) may hold
    /// spaces and parentheses itself, so the fields are counted from its last `)`.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let (_, after_comm) = line.rsplit_once(')')?;
        // After the command name, field 3 (the state) comes first.
        let fields: Vec<&str> = after_comm.split_whitespace().collect();
        let field = |number: usize| fields.get(number - 3)?.parse::<u64>().ok();
        Some(Self {
            utime: field(14)?,
            stime: field(15)?,
            cutime: field(16)?,
            cstime: field(17)?,
            start_ticks: field(22)?,
            virtual_bytes: field(23)?,
            resident_pages: field(24)?,
        })
    }

    /// User and system CPU of the process itself.
    fn cpu_ticks(&self) -> u64 {
        self.utime.saturating_add(self.stime)
    }

    /// User and system CPU of its finished (waited-for) children.
    fn children_cpu_ticks(&self) -> u64 {
        self.cutime.saturating_add(self.cstime)
    }
}

/// The boot time (`btime`, seconds since the epoch) of `/proc/stat`.
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit of open files in `/proc/<pid>/limits` (`Max open files  <soft>  <hard>  files`);
/// none when it is `unlimited`.
fn parse_max_open_files(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The readings from the system: Linux's `/proc` and `sysconf`.
#[cfg(target_os = "linux")]
mod os {
    /// A file of `/proc`, if it can be read.
    pub fn read(path: &str) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }

    /// The unit of the times of `/proc/<pid>/stat` (`USER_HZ`, 100 on most systems).
    pub fn clock_ticks_per_second() -> Option<u64> {
        // SAFETY: sysconf only reads a configuration value; -1 is an error.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        u64::try_from(ticks).ok().filter(|&t| t > 0)
    }

    /// The unit of the resident set size of `/proc/<pid>/stat`.
    pub fn page_size() -> Option<u64> {
        // SAFETY: as above.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size).ok().filter(|&s| s > 0)
    }

    /// The entries of `/proc/self/fd` (the directory being read included, as client_golang
    /// counts).
    pub fn open_fds() -> Option<u64> {
        let entries = std::fs::read_dir("/proc/self/fd").ok()?;
        Some(entries.count() as u64)
    }
}

/// No `/proc` elsewhere: every metric is left out.
#[cfg(not(target_os = "linux"))]
mod os {
    pub fn read(_path: &str) -> Option<String> {
        None
    }

    pub fn clock_ticks_per_second() -> Option<u64> {
        None
    }

    pub fn page_size() -> Option<u64> {
        None
    }

    pub fn open_fds() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line (`cat`), fields 14–17 and 22–24 set apart.
    const STAT: &str = "18755 (cat) R 18748 18748 14011 0 -1 4194304 98 0 0 0 \
        11 22 33 44 20 0 1 0 2849267 3133440 394 18446744073709551615 94896930779136 \
        94896930799017 140725568235024 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";

    #[test]
    fn the_stat_line_is_parsed_by_field_number() {
        assert_eq!(
            Stat::parse(STAT),
            Some(Stat {
                utime: 11,
                stime: 22,
                cutime: 33,
                cstime: 44,
                start_ticks: 2849267,
                virtual_bytes: 3133440,
                resident_pages: 394,
            })
        );
    }

    #[test]
    fn a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields() {
        let expected = Stat::parse(STAT).unwrap();
        for comm in [
            "(a) (b)",
            "(x) ) ()",
            "(tokio-runtime-w)",
            "(a b c d e f)",
            "())",
        ] {
            let line = STAT.replacen("(cat)", comm, 1);
            assert_eq!(Stat::parse(&line), Some(expected), "{line}");
        }
    }

    #[test]
    fn a_truncated_or_garbled_stat_line_gives_nothing() {
        assert_eq!(Stat::parse(""), None);
        assert_eq!(Stat::parse("18755 (cat R 1 2 3"), None);
        assert_eq!(Stat::parse(&STAT[..STAT.find(" 3133440").unwrap()]), None);
        assert_eq!(Stat::parse(&STAT.replace(" 22 ", " x ")), None);
    }

    #[test]
    fn boot_time_and_open_files_limit_are_found() {
        let stat = "cpu  1 2 3\nintr 5 6\nctxt 7\nbtime 1700000000\nprocesses 9\n";
        assert_eq!(parse_boot_time(stat), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu 1 2\n"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63459                63459                processes \n\
                      Max open files            1024                 1048576              files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_open_files(unlimited), None);
    }

    /// The value of the sample `name` (no labels) in a classic text exposition.
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .map(|value| value.parse().expect("a number"))
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_collectors_report_this_process() {
        use crate::telemetry::metrics::{Format, encode, registry};
        use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

        let mut registry = registry();
        registry.register_collector(Box::new(ProcessCollector));
        registry
            .sub_registry_with_prefix("module_manager")
            .register_collector(Box::new(HelmCpuCollector));
        let scrape = || encode(&registry, Format::PrometheusText).unwrap();

        // Some CPU of our own (a tick is 10 ms), and of a finished child.
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let children_before = sample(&scrape(), "module_manager_helm_cpu_seconds_total").unwrap();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(status.success());

        let text = scrape();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let value = |name: &str| sample(&text, name).unwrap_or_else(|| panic!("{name}:\n{text}"));
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"));
        assert!(text.contains("# TYPE process_resident_memory_bytes gauge\n"));
        assert!(text.contains("# TYPE module_manager_helm_cpu_seconds_total counter\n"));
        assert!(value("process_cpu_seconds_total") > 0.0, "{text}");
        assert!(value("process_resident_memory_bytes") > 1024.0 * 1024.0);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        let started = value("process_start_time_seconds");
        assert!(
            now - 3600.0 < started && started < now + 2.0,
            "{started} vs {now}"
        );
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let children = value("module_manager_helm_cpu_seconds_total");
        assert!(children > children_before, "{children_before} → {children}");
    }

    #[cfg(not(target_os = "linux"))]
    #[test]
    fn elsewhere_the_collectors_report_nothing() {
        let mut registry = crate::telemetry::metrics::registry();
        registry.register_collector(Box::new(ProcessCollector));
        registry.register_collector(Box::new(HelmCpuCollector));
        let text = crate::telemetry::metrics::encode(
            &registry,
            crate::telemetry::metrics::Format::PrometheusText,
        );
        assert!(!text.unwrap().contains("cpu_seconds"));
    }
}
