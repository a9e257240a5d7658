//! clap value parsers that keep where a value was written: a flag's value becomes a
//! [`Given`] naming the flag, a variable's value one naming the variable, as clap reports
//! the source to the parser. The domain then blames a bad value on exactly that (no guessing
//! from the environment afterwards). Used by the settings in `cli::args` and by the other
//! flags whose errors name their source (`cli::nvidia`, `cli::dra_args`, `cli::cdi`).

use std::ffi::OsStr;

use clap::builder::{BoolishValueParser, PossibleValue, StringValueParser, TypedValueParser};
use clap::parser::ValueSource;

use crate::domain::config::file::StringOrList;
use crate::domain::config::{Given, Origin};

/// Parses with `P`, then wraps the value with its origin.
#[derive(Debug, Clone)]
pub(crate) struct GivenParser<P>(P);

/// Text, with its origin.
pub(crate) fn text() -> GivenParser<StringValueParser> {
    GivenParser(StringValueParser::new())
}

/// A boolean in clap's (and Go's) spellings (`true`, `false`, `1`, `no`, …), with its origin.
pub(crate) fn boolish() -> GivenParser<BoolishValueParser> {
    GivenParser(BoolishValueParser::new())
}

impl<P> TypedValueParser for GivenParser<P>
where
    P: TypedValueParser,
    P::Value: 'static,
{
    type Value = Given<P::Value>;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Self::Value, clap::Error> {
        self.parse_ref_(cmd, arg, value, ValueSource::CommandLine)
    }

    fn parse_ref_(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
        source: ValueSource,
    ) -> Result<Self::Value, clap::Error> {
        let parsed = self.0.parse_ref_(cmd, arg, value, source)?;
        Ok(Given::new(parsed, origin(arg, source)))
    }

    /// The inner parser's (`--help` lists `true, false` for booleans).
    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        self.0.possible_values()
    }
}

/// The flag (by its long name, whichever alias was typed) or the variable clap read.
fn origin(arg: Option<&clap::Arg>, source: ValueSource) -> Origin {
    let named = match source {
        ValueSource::CommandLine => arg
            .and_then(clap::Arg::get_long)
            .map(|l| Origin::Flag(l.into())),
        ValueSource::EnvVariable => arg
            .and_then(clap::Arg::get_env)
            .map(|e| Origin::Env(e.to_string_lossy().into_owned())),
        ValueSource::DefaultValue => Some(Origin::Default),
        // `ValueSource` is non-exhaustive.
        _ => None,
    };
    named.unwrap_or(Origin::Unnamed)
}

/// What a clap field holds, as the domain's override slot takes it.
pub(crate) trait IntoSlot<R> {
    /// The slot's value.
    fn into_slot(self) -> Option<Given<R>>;
}

impl<R> IntoSlot<R> for Option<Given<R>> {
    fn into_slot(self) -> Option<Given<R>> {
        self
    }
}

/// A comma list (`value_delimiter = ','`, or the flag repeated): one value, named by where
/// its first item was written (clap takes a flag's items or its variable's, never both).
impl IntoSlot<StringOrList> for Option<Vec<Given<String>>> {
    fn into_slot(self) -> Option<Given<StringOrList>> {
        let items = self?;
        let origin = items.first().map_or(Origin::Unnamed, |g| g.origin.clone());
        let values = items.into_iter().map(|g| g.value).collect();
        Some(Given::new(StringOrList::Many(values), origin))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Probe {
        #[arg(long, env = "GPU_SLICER_TEST_GIVEN_PROBE", value_parser = text())]
        probe: Option<Given<String>>,
        #[arg(long, num_args = 0..=1, default_missing_value = "true", value_parser = boolish())]
        bare: Option<Given<bool>>,
        #[arg(long, value_delimiter = ',', value_parser = text())]
        list: Option<Vec<Given<String>>>,
    }

    #[test]
    fn a_flag_value_names_its_flag_and_a_bare_boolean_is_true() {
        let p = Probe::try_parse_from(["x", "--probe", "a", "--bare", "--list=b,c"]).unwrap();
        let flag = |n: &str| Origin::Flag(n.into());
        assert_eq!(p.probe, Some(Given::new("a", flag("probe"))));
        assert_eq!(p.bare, Some(Given::new(true, flag("bare"))));
        let list: Option<Given<StringOrList>> = p.list.into_slot();
        assert_eq!(
            list,
            Some(Given::new(
                StringOrList::Many(vec!["b".into(), "c".into()]),
                flag("list")
            ))
        );
    }

    #[test]
    fn a_variable_value_names_its_variable() {
        let cmd = <Probe as clap::CommandFactory>::command();
        let arg = cmd.get_arguments().find(|a| a.get_id() == "probe").unwrap();
        assert_eq!(
            origin(Some(arg), ValueSource::EnvVariable),
            Origin::Env("GPU_SLICER_TEST_GIVEN_PROBE".into())
        );
        assert_eq!(origin(None, ValueSource::CommandLine), Origin::Unnamed);
    }
}
