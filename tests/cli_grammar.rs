//! One CLI grammar (issue 33), checked on the built binary's own help so that a new flag
//! cannot break it: walk `gpu-slicer -h` into every visible subcommand, read each flag's
//! name, variable, values and aliases, and assert that
//!
//! * a flag means one setting everywhere: the same variable and the same values in every
//!   subcommand that has it, and a variable is read by one flag only;
//! * every setting has a variable (every flag of `run`, the daemon a DaemonSet configures
//!   through its environment);
//! * an alias shown in one command is not another flag's name elsewhere;
//! * `--format` offers `table`, `json` and `yaml` only, `json` in every command;
//! * the daemon's own flags are `run`'s alone: one-shot commands do not list them;
//! * a bad value in a flag's variable is blamed on the variable, whatever its type;
//! * every error, clap's or a command's, comes in one style (`gpu-slicer: error: `).

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-slicer");
const PREFIX: &str = "gpu-slicer: error: ";

/// Flags of `run` that other commands may show too: what discovers the node, plans it and
/// shapes the spec, which one-shot commands act on as well. Every other flag of `run` is the
/// daemon's alone. A new flag of `run` is daemon-only unless added here.
const SHARED_WITH_RUN: &[&str] = &[
    "help",
    "log-format",
    "backend",
    "nvml-lib",
    "proc-root",
    "config",
    "mig-strategy",
    "cdi-kind",
    "mps-root",
    "driver-root",
    "dev-root",
    "container-driver-root",
    "cdi-hook-path",
    "cdi-hook-nvml-lib",
    "cdi-hook-env",
    "node-name",
    "dra-driver-name",
];

/// One flag as a subcommand's `-h` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Flag {
    env: Option<String>,
    values: Option<BTreeSet<String>>,
    aliases: BTreeSet<String>,
}

/// The binary with every variable the walk found removed, so the caller's environment
/// cannot change what a test sees.
fn command(vars: &BTreeSet<String>) -> Command {
    let mut cmd = Command::new(BIN);
    for v in vars {
        cmd.env_remove(v);
    }
    cmd.env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn help(path: &[String]) -> String {
    let out = Command::new(BIN)
        .args(path)
        .arg("-h")
        .env("NO_COLOR", "1")
        .output()
        .expect("run gpu-slicer -h");
    assert!(out.status.success(), "{path:?} -h: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The lines of one `Heading:` section of a help text.
fn section<'a>(help: &'a str, heading: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

/// `[key: …]` of a flag's help line.
fn bracket<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(&format!("[{key}: "))? + key.len() + 3;
    let len = line[start..].find(']')?;
    Some(&line[start..start + len])
}

/// The flags of a help text: one entry per flag, its line and the lines under it (clap
/// puts a long help on the next line).
fn parse_flags(help: &str) -> BTreeMap<String, Flag> {
    let mut entries: Vec<String> = Vec::new();
    for line in section(help, "Options:") {
        let line = line.trim_start();
        match entries.last_mut() {
            Some(entry) if !line.starts_with('-') => {
                entry.push(' ');
                entry.push_str(line);
            }
            _ => entries.push(line.to_string()),
        }
    }
    let mut flags = BTreeMap::new();
    for line in &entries {
        let line = line.as_str();
        let line = match line.strip_prefix('-') {
            Some(rest) if !rest.starts_with('-') => rest.get(3..).unwrap_or(""),
            _ => line,
        };
        let Some(rest) = line.strip_prefix("--") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let env = bracket(line, "env").map(|e| e.split('=').next().unwrap_or(e).to_string());
        let values = bracket(line, "possible values")
            .map(|v| v.split(", ").map(str::to_string).collect::<BTreeSet<_>>());
        let aliases = bracket(line, "aliases")
            .or_else(|| bracket(line, "alias"))
            .map(|a| {
                a.split(", ")
                    .map(|s| s.trim_start_matches('-').to_string())
                    .collect()
            })
            .unwrap_or_default();
        flags.insert(
            name,
            Flag {
                env,
                values,
                aliases,
            },
        );
    }
    flags
}

/// Every visible leaf subcommand (its path) and its flags.
fn walk() -> BTreeMap<Vec<String>, BTreeMap<String, Flag>> {
    let mut leaves = BTreeMap::new();
    let mut todo = vec![Vec::<String>::new()];
    while let Some(path) = todo.pop() {
        let h = help(&path);
        let subs: Vec<String> = section(&h, "Commands:")
            .iter()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| *n != "help")
            .map(str::to_string)
            .collect();
        if subs.is_empty() {
            leaves.insert(path.clone(), parse_flags(&h));
        }
        for s in subs {
            let mut p = path.clone();
            p.push(s);
            todo.push(p);
        }
    }
    leaves
}

fn all_vars(leaves: &BTreeMap<Vec<String>, BTreeMap<String, Flag>>) -> BTreeSet<String> {
    leaves
        .values()
        .flat_map(|f| f.values().filter_map(|f| f.env.clone()))
        .collect()
}

#[test]
fn the_walk_sees_every_command_and_their_settings() {
    let leaves = walk();
    for cmd in [
        "inventory",
        "labels",
        "cdi generate",
        "cdi remove",
        "run",
        "mig apply",
        "dra slices",
        "cdi-hook set-memory-limit",
        "top",
        "advise",
        "demo",
    ] {
        let path: Vec<String> = cmd.split(' ').map(str::to_string).collect();
        assert!(leaves.contains_key(&path), "{cmd} missing from the walk");
    }
    let run = &leaves[&vec!["run".to_string()]];
    assert_eq!(run["config"].env.as_deref(), Some("CONFIG_FILE"));
    assert!(run["config"].aliases.contains("config-file"));
    assert_eq!(
        run["log-format"].values,
        Some(["text", "json"].map(str::to_string).into())
    );
}

#[test]
fn a_flag_reads_one_variable_and_takes_one_value_set_everywhere() {
    let leaves = walk();
    let mut seen: BTreeMap<&str, (&Vec<String>, &Flag)> = BTreeMap::new();
    let mut var_owner: BTreeMap<&str, &str> = BTreeMap::new();
    let names: BTreeSet<&str> = leaves
        .values()
        .flat_map(|f| f.keys().map(String::as_str))
        .collect();
    for (path, flags) in &leaves {
        for (name, flag) in flags {
            if let Some((first, other)) = seen.get(name.as_str()) {
                assert_eq!(
                    flag.env, other.env,
                    "--{name}: variable differs between {path:?} and {first:?}"
                );
                if name != "format" {
                    assert_eq!(
                        flag.values, other.values,
                        "--{name}: values differ between {path:?} and {first:?}"
                    );
                }
            } else {
                seen.insert(name, (path, flag));
            }
            if let Some(var) = &flag.env {
                let owner = var_owner.entry(var).or_insert(name);
                assert_eq!(
                    *owner, name,
                    "{var} is read by --{owner} and by --{name} ({path:?})"
                );
            }
            for alias in &flag.aliases {
                assert!(
                    !names.contains(alias.as_str()),
                    "--{alias}, an alias of --{name} in {path:?}, is a flag of its own elsewhere"
                );
            }
        }
    }
}

#[test]
fn format_takes_table_json_or_yaml_and_json_everywhere() {
    let allowed: BTreeSet<String> = ["table", "json", "yaml"].map(str::to_string).into();
    let mut with_format = 0;
    for (path, flags) in walk() {
        let Some(format) = flags.get("format") else {
            continue;
        };
        with_format += 1;
        let values = format
            .values
            .as_ref()
            .unwrap_or_else(|| panic!("{path:?} --format lists no values"));
        assert!(
            values.is_subset(&allowed),
            "{path:?} --format {values:?}: only table, json, yaml"
        );
        assert!(values.contains("json"), "{path:?} --format lacks json");
    }
    assert!(
        with_format >= 5,
        "only {with_format} commands have --format"
    );
}

#[test]
fn the_daemons_flags_are_runs_alone() {
    let leaves = walk();
    let run = &leaves[&vec!["run".to_string()]];
    let daemon_only: BTreeSet<&str> = run
        .keys()
        .map(String::as_str)
        .filter(|n| !SHARED_WITH_RUN.contains(n))
        .collect();
    for needle in [
        "pass-device-specs",
        "device-list-strategy",
        "mig-layout-file",
    ] {
        assert!(daemon_only.contains(needle), "{needle} is not run's");
    }
    for (path, flags) in &leaves {
        if path == &vec!["run".to_string()] || path == &vec!["mig".to_string(), "apply".into()] {
            continue;
        }
        for name in flags.keys() {
            assert!(
                !daemon_only.contains(name.as_str()),
                "{path:?} lists --{name}, which only the daemon acts on"
            );
        }
    }
    // `mig apply` shares the layout file and layout with the daemon, nothing else of it.
    let mig = &leaves[&vec!["mig".to_string(), "apply".into()]];
    let shared: Vec<&String> = mig
        .keys()
        .filter(|n| daemon_only.contains(n.as_str()))
        .collect();
    assert_eq!(shared, ["mig-layout", "mig-layout-file"]);
}

#[test]
fn every_setting_has_a_variable() {
    // A DaemonSet configures the agent through its environment: every flag of `run` has a
    // variable, and through the rule above, the same one wherever else the flag appears.
    let leaves = walk();
    let run = &leaves[&vec!["run".to_string()]];
    let missing: Vec<&String> = run
        .iter()
        .filter(|(name, flag)| *name != "help" && flag.env.is_none())
        .map(|(name, _)| name)
        .collect();
    assert!(
        missing.is_empty(),
        "run flags without a variable: {missing:?}"
    );
    assert!(run.len() > 40, "only {} run flags seen", run.len());
}

/// `path` run with `var=value` and every other variable cleared; a sim node that does not
/// exist makes a command that parsed its arguments stop at once.
fn with_var(vars: &BTreeSet<String>, path: &[String], var: &str, value: &str) -> Output {
    let mut cmd = command(vars);
    if var != "GPU_SLICER_BACKEND" {
        cmd.env("GPU_SLICER_BACKEND", "sim:/nonexistent/node.yaml");
    }
    cmd.args(path)
        .env(var, value)
        .output()
        .expect("run gpu-slicer")
}

#[test]
fn a_bad_value_in_a_variable_names_the_variable() {
    let leaves = walk();
    let vars = all_vars(&leaves);
    let bad = "no such value!";
    let mut typed = 0;
    for (path, flags) in &leaves {
        for (name, flag) in flags {
            let Some(var) = &flag.env else { continue };
            let out = with_var(&vars, path, var, bad);
            let err = text(&out.stderr);
            let blamed = format!("invalid value '{bad}' for environment variable {var}");
            if flag.values.is_some() {
                typed += 1;
                assert!(err.contains(&blamed), "{path:?} --{name} ({var}): {err}");
            }
            if err.contains(&format!("invalid value '{bad}'")) {
                typed += 1;
                assert!(
                    err.starts_with(&format!("{PREFIX}{blamed}")),
                    "{path:?} --{name} ({var}) blames the flag, not the variable: {err}"
                );
                assert_eq!(out.status.code(), Some(2), "{path:?} {var}: {err}");
            }
        }
    }
    assert!(typed > 10, "only {typed} typed variables probed");
}

#[test]
fn every_command_speaks_one_error_style() {
    let leaves = walk();
    let vars = all_vars(&leaves);
    for path in leaves.keys() {
        let out = command(&vars)
            .args(path)
            .arg("--no-such-flag")
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path:?}: {err}");
        assert!(
            err.starts_with(&format!("{PREFIX}unexpected argument '--no-such-flag'")),
            "{path:?}: {err}"
        );
        assert!(!err.lines().any(|l| l.starts_with("error:")), "{err}");
    }
    // A command's own failure: the same prefix, and the value as written.
    for path in [
        &["inventory"][..],
        &["labels"],
        &["cdi", "generate", "--output", "-"],
        &["dra", "slices", "--node-name", "n"],
    ] {
        let out = command(&vars)
            .args(path)
            .args(["--backend", "sim:/nonexistent/node.yaml"])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path:?}: {err}");
        let line = err
            .lines()
            .find(|l| l.contains("/nonexistent/node.yaml"))
            .unwrap_or_else(|| panic!("{path:?}: {err}"));
        assert!(line.starts_with(PREFIX), "{path:?}: {err}");
    }
}

#[test]
fn cdi_generate_reads_the_config_file_and_cdi_kind_as_run_does() {
    let vars = all_vars(&walk());
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/configs/shares.yaml");
    let count_shares = |out: &Output| text(&out.stdout).matches("-share-").count();
    let generate = |how: &str| {
        let mut cmd = command(&vars);
        cmd.args([
            "cdi",
            "generate",
            "--backend",
            "sim:mixed-a100",
            "--output",
            "-",
            "--no-driver",
        ]);
        match how {
            "flag" => cmd.arg("--config").arg(&config),
            "alias" => cmd.arg("--config-file").arg(&config),
            _ => cmd.env("CONFIG_FILE", &config),
        };
        let out = cmd.env("CDI_KIND", "example.com/gpu").output().unwrap();
        assert!(out.status.success(), "{how}: {}", text(&out.stderr));
        out
    };
    let by_flag = generate("flag");
    assert!(count_shares(&by_flag) > 0, "{}", text(&by_flag.stdout));
    assert!(text(&by_flag.stdout).contains("kind: example.com/gpu"));
    for how in ["alias", "env"] {
        assert_eq!(
            count_shares(&generate(how)),
            count_shares(&by_flag),
            "{how}"
        );
    }
}

#[test]
fn the_fault_point_exists_only_in_test_builds_and_is_read_through_clap() {
    // The tests' binary is built with `fault-injection` (the crate's dev-dependency on
    // itself); a bad fault name is then refused like any variable's bad value.
    let vars = all_vars(&walk());
    let out = with_var(&vars, &["run".to_string()], "GPU_SLICER_FAULT", "nonsense");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(&format!(
            "{PREFIX}invalid value 'nonsense' for environment variable GPU_SLICER_FAULT"
        )),
        "{err}"
    );
    assert!(!help(&["run".to_string()]).contains("--fault"));
}
