//! Where a setting's value came from, carried with the value.
//!
//! A flag, an environment variable, the config file or the built-in default: the command
//! line (`cli`) wraps what it parsed in a [`Given`] naming its flag or variable, the
//! resolver in [`super::settings`] wraps file values with the file and field, and a value
//! that breaks a rule is blamed on that [`Origin`] ([`Given::parse`]), as the user wrote it.

use std::fmt;

use super::ConfigError;

/// Where a setting's value was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A command-line flag, by its long name without the dashes (`mig-strategy`).
    Flag(String),
    /// An environment variable (`MIG_STRATEGY`).
    Env(String),
    /// A field of the config file.
    File {
        /// The file (its path as given).
        path: String,
        /// The field's dotted path (`flags.migStrategy`).
        field: String,
    },
    /// The built-in default.
    Default,
    /// Set through the library without naming a flag or variable (tests, embedders).
    Unnamed,
}

impl fmt::Display for Origin {
    /// As an error names it: ``flag `--mig-strategy` ``, ``env var `MIG_STRATEGY` ``,
    /// `<file>: flags.migStrategy`, `the default`, `command-line setting`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flag(name) => write!(f, "flag `--{name}`"),
            Self::Env(name) => write!(f, "env var `{name}`"),
            Self::File { path, field } => write!(f, "{path}: {field}"),
            Self::Default => f.write_str("the default"),
            Self::Unnamed => f.write_str("command-line setting"),
        }
    }
}

impl Origin {
    /// A field of the file at `path`.
    pub(crate) fn file(path: &str, field: &str) -> Self {
        Self::File {
            path: path.to_string(),
            field: field.to_string(),
        }
    }

    /// The error for a value from here that breaks a rule, naming the value as written: a
    /// file value is blamed on the file and its field, anything else on the flag or variable
    /// that set it.
    pub(crate) fn invalid(
        &self,
        value: impl fmt::Display,
        message: impl Into<String>,
    ) -> ConfigError {
        let (value, message) = (format!("`{value}`"), message.into());
        match self {
            Self::File { path, field } => ConfigError::Invalid {
                path: path.clone(),
                field: field.clone(),
                value,
                message,
            },
            other => ConfigError::Setting {
                setting: other.to_string(),
                value,
                message,
            },
        }
    }
}

/// A value as written, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Given<T> {
    /// The value as parsed by the layer that read it (text, a boolean, a list).
    pub(crate) value: T,
    /// Where it was written.
    pub(crate) origin: Origin,
}

impl<T> Given<T> {
    /// `value`, written at `origin`.
    pub(crate) fn new(value: impl Into<T>, origin: Origin) -> Self {
        Self {
            value: value.into(),
            origin,
        }
    }

    /// Check and convert the value; a refusal is blamed on [`Self::origin`], naming the value
    /// (or the part of it that [`Refusal::part`] singles out) as written.
    pub(crate) fn parse<U>(&self, parse: impl FnOnce(&T) -> Result<U, Refusal>) -> super::Result<U>
    where
        T: fmt::Display,
    {
        parse(&self.value).map_err(|r| {
            let value = r.part.unwrap_or_else(|| self.value.to_string());
            self.origin.invalid(value, r.message)
        })
    }
}

/// A value set without naming where (see [`Origin::Unnamed`]).
impl<T> From<T> for Given<T> {
    fn from(value: T) -> Self {
        Self {
            value,
            origin: Origin::Unnamed,
        }
    }
}

/// Text set without naming where (see [`Origin::Unnamed`]).
impl From<&str> for Given<String> {
    fn from(value: &str) -> Self {
        Self::from(value.to_string())
    }
}

/// Why a value was refused: the rule it broke and, when one part of it is to blame (an item
/// of a list), that part as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The rule, as the error states it (`expected none, single or mixed`).
    pub(crate) message: String,
    /// The part of the value to name instead of the whole.
    pub(crate) part: Option<String>,
}

impl Refusal {
    /// `part` of the value breaks `message`.
    pub(crate) fn of_part(part: impl fmt::Display, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            part: Some(part.to_string()),
        }
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Self {
            message,
            part: None,
        }
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        Self::from(message.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_origin_names_itself_as_errors_do() {
        let cases = [
            (Origin::Flag("mig-strategy".into()), "flag `--mig-strategy`"),
            (Origin::Env("MIG_STRATEGY".into()), "env var `MIG_STRATEGY`"),
            (
                Origin::file("/etc/c.yaml", "flags.dra.driverName"),
                "/etc/c.yaml: flags.dra.driverName",
            ),
            (Origin::Default, "the default"),
            (Origin::Unnamed, "command-line setting"),
        ];
        for (origin, named) in cases {
            assert_eq!(origin.to_string(), named);
        }
    }

    #[test]
    fn a_refused_value_is_blamed_on_its_origin_as_written() {
        let flag = Given::<String>::new("bogus", Origin::Flag("mig-strategy".into()));
        let err = flag
            .parse(|_| Err::<(), _>(Refusal::from("expected none, single or mixed")))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid flag `--mig-strategy` = `bogus`: expected none, single or mixed"
        );
        let file = Given::<String>::new("a,b", Origin::file("c.yaml", "flags.x"));
        let err = file
            .parse(|_| Err::<(), _>(Refusal::of_part("b", "no")))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config c.yaml: field `flags.x` = `b`: no"
        );
    }
}
