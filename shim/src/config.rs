//! The one `MEMTRACE_*` configuration table, read once when the library loads.
//!
//! Every variable has a default; an invalid value produces a [`ConfigError`] that names the
//! variable, the value and what was expected, and the default is used instead. Nothing here can
//! stop the host process.

use std::sync::OnceLock;

use crate::log::{self, LogLevel};

/// One entry of the table: the variable, its default and what it means (printed with
/// `MEMTRACE_LOG=debug`, and used in the README).
pub struct Var {
    /// Environment variable name.
    pub name: &'static str,
    /// The default, as text.
    pub default: &'static str,
    /// What it controls.
    pub help: &'static str,
}

/// How long a producer waits on a writer that makes no progress before dropping an event,
/// unless `MEMTRACE_MAX_WAIT_MS` says otherwise (see `ring::MAX_WAIT_NS`).
pub const DEFAULT_MAX_WAIT_MS: u64 = 1000;

/// The whole table.
pub const VARS: [Var; 9] = [
    Var { name: "MEMTRACE_OUT", default: "memtrace-%p.mtrace", help: "output path; %p = pid, %% = %" },
    Var { name: "MEMTRACE_KERNELS", default: "1", help: "record kernel launches (0/1)" },
    Var { name: "MEMTRACE_CUPTI", default: "0", help: "enable the CUPTI kernel/memory activity layer (0/1)" },
    Var {
        name: "MEMTRACE_MAX_BYTES",
        default: "0",
        help: "stop recording (with a marker) past this file size, as memsim reads sizes (64KiB, 10MiB, 2GiB; \
               KB/MB/GB are decimal); 0 = no limit",
    },
    Var { name: "MEMTRACE_QUIET", default: "0", help: "no summary on stderr at exit (0/1)" },
    Var {
        name: "MEMTRACE_FOLLOW_FORK",
        default: "1",
        help: "fork children trace into their own file (%p, or NAME.PID.EXT beside a path without it) (1) or stop (0)",
    },
    Var { name: "MEMTRACE_LOG", default: "warn", help: "off|warn|info|debug" },
    Var { name: "MEMTRACE_QUEUE", default: "16384", help: "per-thread event ring capacity (events, 1024..=16777216)" },
    Var {
        name: "MEMTRACE_MAX_WAIT_MS",
        default: "1000",
        help: "how long a thread waits for a full ring while the writer makes no progress before it drops the event, \
               counted as lost (ms, 1..=3600000)",
    },
];

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Output path pattern (`%p` is replaced by the pid).
    pub out: String,
    /// Record kernel launches.
    pub kernels: bool,
    /// Enable the CUPTI layer.
    pub cupti: bool,
    /// Maximum trace size in bytes; 0 = unlimited.
    pub max_bytes: u64,
    /// Suppress the exit summary.
    pub quiet: bool,
    /// Keep tracing in fork children.
    pub follow_fork: bool,
    /// Log level.
    pub log: LogLevel,
    /// Queue capacity in events.
    pub queue: usize,
    /// How long a producer waits on a stalled writer before dropping an event, in ms.
    pub max_wait_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            out: "memtrace-%p.mtrace".to_string(),
            kernels: true,
            cupti: false,
            max_bytes: 0,
            quiet: false,
            follow_fork: true,
            log: LogLevel::Warn,
            queue: 16384,
            max_wait_ms: DEFAULT_MAX_WAIT_MS,
        }
    }
}

/// An invalid configuration value. The default was used instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A variable had a value that does not parse.
    #[error("{var}={value:?} is invalid: expected {expected}; using the default {default:?}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
        /// The default used instead.
        default: &'static str,
    },
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        // Empty is no value, as for the other variables: said, and the default kept (it turned
        // recording of kernels, or fork following, off in silence).
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

fn parse_level(v: &str) -> Option<LogLevel> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "none" => Some(LogLevel::Off),
        "warn" | "warning" | "error" => Some(LogLevel::Warn),
        "info" | "1" => Some(LogLevel::Info),
        "debug" | "2" => Some(LogLevel::Debug),
        _ => None,
    }
}

/// Whether a pattern is usable as an output path: non-empty, and every `%` starts `%p` or `%%`.
fn valid_pattern(v: &str) -> bool {
    if v.is_empty() {
        return false;
    }
    let b = v.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            match b.get(i + 1) {
                Some(b'p') | Some(b'%') => i += 2,
                _ => return false,
            }
        } else {
            i += 1;
        }
    }
    true
}

/// Whether an output pattern names the pid (`%p`, not the literal `%%p`): [`expand_out`] is the
/// one reader of the pattern, so two pids giving two paths says it.
pub fn names_pid(pattern: &str) -> bool {
    expand_out(pattern, 1) != expand_out(pattern, 2)
}

/// Expand `%p` (pid) and `%%` in an output pattern.
pub fn expand_out(pattern: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.peek() {
                Some('p') => {
                    chars.next();
                    out.push_str(&pid.to_string());
                }
                Some('%') => {
                    chars.next();
                    out.push('%');
                }
                _ => out.push('%'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Config {
    /// Read the table through `get` (the environment, or a map in tests). Returns the
    /// configuration and one error per rejected value.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (Config, Vec<ConfigError>) {
        let mut c = Config::default();
        let mut errors = Vec::new();
        let mut bad = |var: &'static str, value: &str, expected: &'static str| {
            let default = VARS.iter().find(|v| v.name == var).map(|v| v.default).unwrap_or("");
            errors.push(ConfigError::Invalid { var, value: value.to_string(), expected, default });
        };
        if let Some(v) = get("MEMTRACE_OUT") {
            if valid_pattern(&v) {
                c.out = v;
            } else {
                bad("MEMTRACE_OUT", &v, "a non-empty path where % is only used as %p or %%");
            }
        }
        let bools: [(&'static str, &mut bool); 4] = [
            ("MEMTRACE_KERNELS", &mut c.kernels),
            ("MEMTRACE_CUPTI", &mut c.cupti),
            ("MEMTRACE_QUIET", &mut c.quiet),
            ("MEMTRACE_FOLLOW_FORK", &mut c.follow_fork),
        ];
        for (var, slot) in bools {
            if let Some(v) = get(var) {
                match parse_bool(&v) {
                    Some(b) => *slot = b,
                    None => bad(var, &v, "one of 0, 1, true, false, yes, no, on, off"),
                }
            }
        }
        if let Some(v) = get("MEMTRACE_MAX_BYTES") {
            match trace::units::parse_size(&v) {
                Ok(n) => c.max_bytes = n,
                Err(_) => bad("MEMTRACE_MAX_BYTES", &v, "a size such as 1000000, 64KiB, 10MiB or 2GiB (0 = no limit)"),
            }
        }
        if let Some(v) = get("MEMTRACE_LOG") {
            match parse_level(&v) {
                Some(l) => c.log = l,
                None => bad("MEMTRACE_LOG", &v, "one of off, warn, info, debug"),
            }
        }
        if let Some(v) = get("MEMTRACE_QUEUE") {
            match v.trim().parse::<usize>() {
                Ok(n) if (1024..=1 << 24).contains(&n) => c.queue = n,
                _ => bad("MEMTRACE_QUEUE", &v, "an event count between 1024 and 16777216"),
            }
        }
        if let Some(v) = get("MEMTRACE_MAX_WAIT_MS") {
            match v.trim().parse::<u64>() {
                Ok(n) if (1..=3_600_000).contains(&n) => c.max_wait_ms = n,
                _ => bad("MEMTRACE_MAX_WAIT_MS", &v, "milliseconds between 1 and 3600000"),
            }
        }
        (c, errors)
    }

    /// The value of one variable as this configuration holds it, for the debug log.
    pub fn show(&self, var: &str) -> String {
        match var {
            "MEMTRACE_OUT" => self.out.clone(),
            "MEMTRACE_KERNELS" => (self.kernels as u8).to_string(),
            "MEMTRACE_CUPTI" => (self.cupti as u8).to_string(),
            "MEMTRACE_MAX_BYTES" => self.max_bytes.to_string(),
            "MEMTRACE_QUIET" => (self.quiet as u8).to_string(),
            "MEMTRACE_FOLLOW_FORK" => (self.follow_fork as u8).to_string(),
            "MEMTRACE_LOG" => format!("{:?}", self.log).to_ascii_lowercase(),
            "MEMTRACE_QUEUE" => self.queue.to_string(),
            "MEMTRACE_MAX_WAIT_MS" => self.max_wait_ms.to_string(),
            _ => String::new(),
        }
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

fn load() -> Config {
    let (mut cfg, errors) = Config::from_lookup(|k| std::env::var(k).ok());
    log::set_level(cfg.log);
    for e in &errors {
        crate::log!(Warn, "{e}");
    }
    for v in VARS.iter() {
        if matches!(std::env::var(v.name), Err(std::env::VarError::NotUnicode(_))) {
            crate::log!(Warn, "{} is not valid UTF-8; ignored, using the default {:?}", v.name, v.default);
        }
    }
    // A relative path is the one the program was started in: a program that changes its
    // directory before its first CUDA call (Hydra does) wrote its trace somewhere else, under the
    // relative name the summary printed.
    if !cfg.out.starts_with('/') {
        let why = match std::env::current_dir().map(|d| d.to_str().map(str::to_string)) {
            // The directory is literal text in a pattern: its own `%` is escaped.
            Ok(Some(dir)) => {
                cfg.out = format!("{}/{}", dir.trim_end_matches('/').replace('%', "%%"), cfg.out);
                None
            }
            Ok(None) => Some("the start directory's name is not UTF-8".to_string()),
            Err(e) => Some(format!("the start directory cannot be read ({e})")),
        };
        // The path stays relative: a program that changes directory moves the trace.
        if let Some(why) = why {
            crate::log!(
                Warn,
                "MEMTRACE_OUT={:?} is relative and {why}: it is taken from the directory the program is in \
                 when recording starts; give an absolute path",
                cfg.out
            );
        }
    }
    let names: Vec<String> = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).collect();
    for (name, meant) in near_misses(names.iter().map(String::as_str)) {
        crate::log!(Warn, "{name} is not a variable of the shim (did you mean {meant}?); ignored");
    }
    if cfg.out.to_ascii_lowercase().ends_with(".jsonl") {
        crate::log!(
            Warn,
            "MEMTRACE_OUT={}: the shim writes the binary trace format whatever the name; memsim reads \
             it by its content, other JSON Lines readers will not (name it .mtrace, or `memsim convert` it)",
            cfg.out
        );
    }
    if log::enabled(LogLevel::Debug) {
        for v in VARS.iter() {
            crate::log!(Debug, "{} = {} (default {}): {}", v.name, cfg.show(v.name), v.default, v.help);
        }
    }
    cfg
}

/// The configuration (read from the environment once).
pub fn config() -> &'static Config {
    CONFIG.get_or_init(load)
}

/// Environment names that look like a misspelt variable of the table (`MEMTRACE_KERNEL`), each
/// with the ones it may mean (`MEMTRACE_MAX`: both `MEMTRACE_MAX_*`), as "A or B". Other
/// `MEMTRACE_*` names (the other tools', `MEMTRACE_BIN_DIR`, ...) are not near any, and pass
/// unsaid.
pub fn near_misses<'a>(names: impl Iterator<Item = &'a str>) -> Vec<(&'a str, String)> {
    names
        .filter(|n| n.starts_with("MEMTRACE_") && !VARS.iter().any(|v| v.name == *n))
        // One slip in a short name, two in a long one: `MEMTRACE_SO` (another tool's) is two
        // edits from `MEMTRACE_LOG` and is no typo of it. A name that goes on past one of ours
        // (`MEMTRACE_OUTPUT`, `MEMTRACE_QUEUE_SIZE`) or stops short of one by more than a slip
        // (`MEMTRACE_MAX_WAIT`) is one too; no other tool's name begins so.
        .filter_map(|n| {
            let most = if n.len() - "MEMTRACE_".len() < 8 { 1 } else { 2 };
            let upper = n.to_ascii_uppercase();
            let prefix = |v: &Var| upper.starts_with(v.name) || (n.len() >= 12 && v.name.starts_with(upper.as_str()));
            let meant: Vec<&str> =
                VARS.iter().filter(|v| edits(n, v.name) <= most || prefix(v)).map(|v| v.name).collect();
            (!meant.is_empty()).then(|| (n, meant.join(" or ")))
        })
        .collect()
}

/// Edits between two names, ignoring case, a swap of neighbours counting one (the optimal
/// string alignment distance: `QUITE` is one from `QUIET`).
fn edits(a: &str, b: &str) -> usize {
    strsim::osa_distance(&a.to_ascii_uppercase(), &b.to_ascii_uppercase())
}

/// The configuration, if it has been read.
pub fn config_if_read() -> Option<&'static Config> {
    CONFIG.get()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(env: &[(&str, &str)], expect: impl Fn(&Config), errors: usize) {
        let (c, e) = Config::from_lookup(|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()));
        expect(&c);
        assert_eq!(e.len(), errors, "{env:?}: {e:?}");
    }

    #[test]
    fn the_table_states_the_defaults_the_code_uses() {
        let (c, errors) = Config::from_lookup(|k| VARS.iter().find(|v| v.name == k).map(|v| v.default.to_string()));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(c, Config::default());
    }

    #[test]
    fn table() {
        check(&[], |c| assert_eq!(c, &Config::default()), 0);
        check(&[("MEMTRACE_MAX_BYTES", "10M")], |c| assert_eq!(c.max_bytes, 10 << 20), 0);
        // Sizes read as memsim reads them (`trace::units`): MB is decimal, fractions round.
        check(&[("MEMTRACE_MAX_BYTES", "10MB")], |c| assert_eq!(c.max_bytes, 10_000_000), 0);
        check(&[("MEMTRACE_MAX_BYTES", "1.5GiB")], |c| assert_eq!(c.max_bytes, 3 << 29), 0);
        check(&[("MEMTRACE_MAX_BYTES", "abc")], |c| assert_eq!(c.max_bytes, 0), 1);
        check(&[("MEMTRACE_KERNELS", "off")], |c| assert!(!c.kernels), 0);
        check(&[("MEMTRACE_MAX_WAIT_MS", "60000")], |c| assert_eq!(c.max_wait_ms, 60_000), 0);
        check(&[("MEMTRACE_MAX_WAIT_MS", "0")], |c| assert_eq!(c.max_wait_ms, 1000), 1);
        check(&[("MEMTRACE_KERNELS", "maybe")], |c| assert!(c.kernels), 1);
        // Empty is no value for every variable (it was "off" for the on/off ones).
        check(&[("MEMTRACE_KERNELS", "")], |c| assert!(c.kernels), 1);
        check(&[("MEMTRACE_FOLLOW_FORK", " ")], |c| assert!(c.follow_fork), 1);
        check(&[("MEMTRACE_OUT", "x/%q")], |c| assert_eq!(c.out, "memtrace-%p.mtrace"), 1);
        check(&[("MEMTRACE_OUT", "")], |c| assert_eq!(c.out, "memtrace-%p.mtrace"), 1);
        check(
            &[("MEMTRACE_LOG", "debug"), ("MEMTRACE_QUEUE", "7")],
            |c| {
                assert_eq!(c.log, LogLevel::Debug);
                assert_eq!(c.queue, 16384)
            },
            1,
        );
    }

    #[test]
    fn error_names_variable_and_default() {
        let (_, e) = Config::from_lookup(|k| (k == "MEMTRACE_QUIET").then(|| "2".to_string()));
        let msg = e[0].to_string();
        assert!(msg.contains("MEMTRACE_QUIET=\"2\"") && msg.contains("default \"0\""), "{msg}");
    }

    #[test]
    fn misspelt_variables_are_found_and_the_other_tools_are_not() {
        let names = [
            "MEMTRACE_KERNEL",
            "MEMTRACE_OUTT",
            "MEMTRACE_FOLOW_FORK",
            "MEMTRACE_MAX_BYTE",
            "MEMTRACE_QUITE",
            "MEMTRACE_LGO",
            "MEMTRACE_Out",
            "MEMTRACE_BIN_DIR",
            "MEMTRACE_ML_MODEL",
            "MEMTRACE_SO",
            "MEMTRACE_SHIM",
            "MEMTRACE_PYTHON",
            "MEMTRACE_PROFILE",
            "MEMTRACE_OUT",
            "PATH",
            "MEMTRACE_OUTPUT",
            "MEMTRACE_OUT_FILE",
            "MEMTRACE_QUEUE_SIZE",
            "MEMTRACE_MAX_WAIT",
            "MEMTRACE_LOG_LEVEL",
            "MEMTRACE_CUPTI_ENABLE",
            "MEMTRACE_LAUNCH_PID",
            "MEMTRACE_DEMO_OUT",
            "MEMTRACE_REAL_CUDART_DIR",
            "MEMTRACE_TRACEBACK",
            "MEMTRACE_MAX",
        ];
        assert_eq!(
            near_misses(names.into_iter()),
            vec![
                ("MEMTRACE_KERNEL", "MEMTRACE_KERNELS"),
                ("MEMTRACE_OUTT", "MEMTRACE_OUT"),
                ("MEMTRACE_FOLOW_FORK", "MEMTRACE_FOLLOW_FORK"),
                ("MEMTRACE_MAX_BYTE", "MEMTRACE_MAX_BYTES"),
                ("MEMTRACE_QUITE", "MEMTRACE_QUIET"),
                ("MEMTRACE_LGO", "MEMTRACE_LOG"),
                ("MEMTRACE_Out", "MEMTRACE_OUT"),
                ("MEMTRACE_OUTPUT", "MEMTRACE_OUT"),
                ("MEMTRACE_OUT_FILE", "MEMTRACE_OUT"),
                ("MEMTRACE_QUEUE_SIZE", "MEMTRACE_QUEUE"),
                ("MEMTRACE_MAX_WAIT", "MEMTRACE_MAX_WAIT_MS"),
                ("MEMTRACE_LOG_LEVEL", "MEMTRACE_LOG"),
                ("MEMTRACE_CUPTI_ENABLE", "MEMTRACE_CUPTI"),
                ("MEMTRACE_MAX", "MEMTRACE_MAX_BYTES or MEMTRACE_MAX_WAIT_MS"),
            ]
            .into_iter()
            .map(|(n, m)| (n, m.to_string()))
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn expand() {
        assert_eq!(expand_out("runs/%p.mtrace", 42), "runs/42.mtrace");
        assert_eq!(expand_out("a%%b-%p", 7), "a%b-7");
        assert!(names_pid("runs/%p.mtrace") && names_pid("a%%b-%p"));
        assert!(!names_pid("same.mtrace") && !names_pid("lit%%p.mtrace") && !names_pid("%"));
    }

    proptest::proptest! {
        #[test]
        fn sizes_round_trip(n in 0u64..(1 << 40)) {
            proptest::prop_assert_eq!(trace::units::parse_size(&n.to_string()), Ok(n));
            proptest::prop_assert_eq!(trace::units::parse_size(&format!("{}K", n >> 10)), Ok((n >> 10) << 10));
        }

        #[test]
        fn never_panics(v in ".*") {
            let (_, _) = Config::from_lookup(|_| Some(v.clone()));
        }
    }
}
