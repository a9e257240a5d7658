//! Clap's bad-value errors told against the environment variable that held the value.
//!
//! Clap names the flag (`invalid value 'xyz' for '--health-quiet-period <…>'`) even when the
//! value came from the flag's variable, for every parser that is not ours (durations,
//! numbers, `LOG_FORMAT`'s choices, booleans). The docs promise that an error names where
//! the value was written, so `main` passes every parse error through [`blame_env`], which
//! rewrites the flag's name into the variable's when the flag is absent from the command
//! line and the variable holds the rejected value. Pure: the caller hands it the command
//! tree, the arguments and a lookup of the environment.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// `err` with the flag it names replaced by the environment variable that gave the bad
/// value, when that is where the value came from; otherwise `err` unchanged.
pub(crate) fn blame_env(
    err: clap::Error,
    cmd: &clap::Command,
    argv: &[OsString],
    env: impl Fn(&str) -> Option<OsString>,
) -> clap::Error {
    if !matches!(
        err.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return err;
    }
    let (Some(ContextValue::String(shown)), Some(ContextValue::String(value))) = (
        err.get(ContextKind::InvalidArg),
        err.get(ContextKind::InvalidValue),
    ) else {
        return err;
    };
    let Some(long) = shown
        .strip_prefix("--")
        .and_then(|s| s.split([' ', '=']).next())
    else {
        return err;
    };
    let mut args = Vec::new();
    collect_args(cmd, long, &mut args);
    let from_env = args.iter().find_map(|arg| {
        let var = arg.get_env()?.to_str()?;
        let held = env(var)?;
        (held.to_str() == Some(value.as_str()) && !on_command_line(arg, argv)).then_some(var)
    });
    let Some(var) = from_env else {
        return err;
    };
    let text = err.to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let rewritten = text.replacen(
        &format!("'{shown}'"),
        &format!("environment variable {var} (the --{long} setting)"),
        1,
    );
    clap::Error::raw(err.kind(), rewritten)
}

/// Every argument of `cmd` and its subcommands whose long name is `long`.
fn collect_args<'a>(cmd: &'a clap::Command, long: &str, out: &mut Vec<&'a clap::Arg>) {
    out.extend(cmd.get_arguments().filter(|a| a.get_long() == Some(long)));
    for sub in cmd.get_subcommands() {
        collect_args(sub, long, out);
    }
}

/// Whether `argv` sets `arg` itself (`--name`, `--name=v`, an alias, or its short form).
fn on_command_line(arg: &clap::Arg, argv: &[OsString]) -> bool {
    let mut longs: Vec<&str> = arg.get_long().into_iter().collect();
    longs.extend(arg.get_all_aliases().unwrap_or_default());
    let short = arg.get_short().map(|c| format!("-{c}"));
    argv.iter().filter_map(|a| a.to_str()).any(|a| {
        longs.iter().any(|l| {
            a.strip_prefix("--")
                .is_some_and(|rest| rest == *l || rest.starts_with(&format!("{l}=")))
        }) || short
            .as_deref()
            .is_some_and(|s| a.starts_with(s) && !a.starts_with("--"))
    })
}

#[cfg(test)]
mod tests {
    use clap::{Arg, Command};

    use super::*;

    fn cmd() -> Command {
        Command::new("probe").subcommand(
            Command::new("run")
                .arg(
                    Arg::new("quiet")
                        .long("quiet-period")
                        .env("PROBE_QUIET_PERIOD")
                        .value_parser(clap::value_parser!(u32)),
                )
                .arg(
                    Arg::new("format")
                        .long("format")
                        .env("PROBE_FORMAT")
                        .value_parser(["text", "json"]),
                ),
        )
    }

    fn parse(argv: &[&str], vars: &[(&str, &str)]) -> String {
        let argv: Vec<OsString> = argv.iter().map(OsString::from).collect();
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        };
        // Clap reads the real environment; the fake lookup stands in for it here, so the
        // value is given as the flag and the lookup says where it "came from".
        let err = cmd().try_get_matches_from(&argv).unwrap_err();
        let argv_without_flag: Vec<OsString> = argv
            .iter()
            .filter(|a| !a.to_string_lossy().starts_with("--"))
            .cloned()
            .collect();
        let on_cli = vars.is_empty();
        let argv = if on_cli { argv } else { argv_without_flag };
        blame_env(err, &cmd(), &argv, env).to_string()
    }

    #[test]
    fn a_bad_value_from_a_variable_names_the_variable_for_every_value_type() {
        let msg = parse(
            &["probe", "run", "--quiet-period=xyz"],
            &[("PROBE_QUIET_PERIOD", "xyz")],
        );
        assert!(
            msg.contains("invalid value 'xyz' for environment variable PROBE_QUIET_PERIOD"),
            "{msg}"
        );
        assert!(!msg.contains("'--quiet-period"), "{msg}");
        let msg = parse(
            &["probe", "run", "--format", "xml"],
            &[("PROBE_FORMAT", "xml")],
        );
        assert!(
            msg.contains("environment variable PROBE_FORMAT (the --format setting)"),
            "{msg}"
        );
    }

    #[test]
    fn a_bad_flag_value_still_names_the_flag() {
        let msg = parse(&["probe", "run", "--quiet-period", "xyz"], &[]);
        assert!(msg.contains("'--quiet-period <quiet>'"), "{msg}");
        assert!(!msg.contains("environment variable"), "{msg}");
    }

    #[test]
    fn a_flag_on_the_command_line_wins_over_a_variable_of_the_same_value() {
        let argv: Vec<OsString> = ["probe", "run", "--quiet-period=xyz"]
            .iter()
            .map(OsString::from)
            .collect();
        let err = cmd().try_get_matches_from(&argv).unwrap_err();
        let msg = blame_env(err, &cmd(), &argv, |_| Some("xyz".into())).to_string();
        assert!(!msg.contains("environment variable"), "{msg}");
    }
}
