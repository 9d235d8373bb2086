//! Command lines, for when a binary is not run as a CNI plugin: each
//! binary's verbs defined once (name, synopsis, options, what it does,
//! and the function that runs it), and from that one definition its
//! usage, its `--help` text and the parsing of its options.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::{cni, skel};

/// A binary's command line.
pub struct Program {
    pub name: &'static str,
    /// What it is, in one line: the about text's.
    pub purpose: &'static str,
    /// What `--help` says before the verbs.
    pub description: &'static str,
    pub verbs: &'static [Verb],
    /// What `--help` says after the verbs.
    pub notes: &'static str,
}

/// One verb of a command line.
pub struct Verb {
    pub name: &'static str,
    /// Its options and operands, as its usage shows them.
    pub synopsis: &'static str,
    /// The options it takes.
    pub options: &'static [Opt],
    /// Whether it takes operands (arguments that are not options).
    pub operands: bool,
    /// What it does, in paragraphs of lines of at most 62 characters.
    pub help: &'static str,
    /// Runs it; a problem with the options it was given is an `Err`,
    /// reported as a usage error.
    pub run: fn(&Options) -> Result<ExitCode, String>,
}

/// An option: `--name VALUE` (or `--name=VALUE`), or a flag.
pub struct Opt {
    pub name: &'static str,
    /// Whether it takes a value.
    pub takes_value: bool,
}

impl Opt {
    /// An option that takes a value.
    pub const fn value(name: &'static str) -> Opt {
        Opt {
            name,
            takes_value: true,
        }
    }

    /// A flag, which takes none.
    pub const fn flag(name: &'static str) -> Opt {
        Opt {
            name,
            takes_value: false,
        }
    }
}

/// The options a verb was given, in order, and its operands.
#[derive(Debug, Default)]
pub struct Options {
    given: Vec<(&'static str, Option<String>)>,
    operands: Vec<String>,
}

impl Options {
    /// The value of option `name`, the last one given.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.given
            .iter()
            .rev()
            .find(|(given, _)| *given == name)
            .and_then(|(_, value)| value.as_deref())
    }

    /// As [`Options::value`], as a path.
    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.value(name).map(PathBuf::from)
    }

    /// The last given of options `names`, and its value.
    pub fn last(&self, names: &[&str]) -> Option<(&'static str, Option<&str>)> {
        self.given
            .iter()
            .rev()
            .find(|(given, _)| names.contains(given))
            .map(|(given, value)| (*given, value.as_deref()))
    }

    /// Whether flag `name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.given.iter().any(|(given, _)| *given == name)
    }

    /// The arguments that are not options, in order.
    pub fn operands(&self) -> &[String] {
        &self.operands
    }

    /// The options as arguments again, each `--name=VALUE` or a flag,
    /// then the operands: for a program that reads them itself.
    pub fn to_args(&self) -> Vec<String> {
        let options = self.given.iter().map(|(name, value)| match value {
            Some(value) => format!("{name}={value}"),
            None => (*name).to_owned(),
        });
        options.chain(self.operands.iter().cloned()).collect()
    }
}

impl Program {
    /// Runs the command line `args` (without the program name): the verb
    /// it names, `--help`, `--version`, or, with no arguments, the about
    /// text (as a CNI plugin run by hand says it).
    pub fn main(&self, args: impl IntoIterator<Item = OsString>) -> ExitCode {
        let args: Vec<OsString> = args.into_iter().collect();
        let Some(first) = args.first() else {
            return skel::about(self.name, self.purpose);
        };
        let alone = args.len() == 1;
        match first.to_str() {
            Some("--help" | "-h" | "help") if alone => print(&self.help()),
            Some("--version" | "-V") if alone => print(&version(self.name)),
            Some(name) => match self.verbs.iter().find(|v| v.name == name) {
                Some(verb) => match verb.parse(&args[1..]).and_then(|o| (verb.run)(&o)) {
                    Ok(status) => status,
                    Err(problem) => verb.usage_error(self.name, &problem),
                },
                None => self.usage_error(&format!("unknown command {name:?}")),
            },
            None => self.usage_error(&format!("unknown command {first:?}")),
        }
    }

    /// One line per verb, and --help and --version.
    pub fn usage(&self) -> String {
        let mut usage = String::from("usage:\n");
        for verb in self.verbs {
            usage.push_str(&format!(
                "  {} {} {}\n",
                self.name, verb.name, verb.synopsis
            ));
        }
        usage.push_str(&format!("  {} --help | --version\n", self.name));
        usage
    }

    /// What `--help` prints: the description, each verb with what it
    /// does, the notes.
    pub fn help(&self) -> String {
        let mut help = format!(
            "{}: {}\n\n{}\nCommands:\n",
            self.name, self.purpose, self.description
        );
        for verb in self.verbs {
            help.push_str(&format!("  {} {}\n", verb.name, verb.synopsis));
            for line in verb.help.lines() {
                if line.is_empty() {
                    help.push('\n');
                } else {
                    help.push_str(&format!("          {line}\n"));
                }
            }
        }
        if !self.notes.is_empty() {
            help.push('\n');
            help.push_str(self.notes);
        }
        help.push_str("\n  --help     this text\n  --version  the version, the CNI spec versions it speaks, its flavour\n");
        help
    }

    /// A usage error: what is wrong and the usage on stderr, exit status 2.
    pub fn usage_error(&self, problem: &str) -> ExitCode {
        let _ = write!(
            std::io::stderr(),
            "{}: {problem}\n{}",
            self.name,
            self.usage()
        );
        ExitCode::from(2)
    }
}

impl Verb {
    /// Reads `args`, the arguments after the verb: each a known option
    /// (`--name VALUE`, `--name=VALUE`, or a flag), or an operand if the
    /// verb takes them. What is wrong is said in one line.
    pub fn parse(&self, args: &[OsString]) -> Result<Options, String> {
        let mut options = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let arg = arg
                .to_str()
                .ok_or_else(|| format!("{arg:?} is not UTF-8"))?;
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (arg, None),
            };
            let Some(option) = self.options.iter().find(|o| o.name == name) else {
                if self.operands && !arg.starts_with('-') {
                    options.operands.push(arg.to_owned());
                    continue;
                }
                return Err(format!("unknown option {arg:?}"));
            };
            let value = match (option.takes_value, inline) {
                (false, None) => None,
                (false, Some(_)) => return Err(format!("unknown option {arg:?}")),
                (true, Some(value)) => Some(value),
                (true, None) => Some(
                    args.next()
                        .and_then(|v| v.to_str())
                        .map(String::from)
                        .ok_or_else(|| format!("{name} needs a value"))?,
                ),
            };
            options.given.push((option.name, value));
        }
        Ok(options)
    }

    /// For tests: [`Verb::parse`] of `words`.
    #[cfg(test)]
    pub fn parse_words(&self, words: &[&str]) -> Result<Options, String> {
        let args: Vec<OsString> = words.iter().map(OsString::from).collect();
        self.parse(&args)
    }

    /// Its usage, as `program` runs it, and what it does.
    pub fn usage(&self, program: &str) -> String {
        format!(
            "usage: {program} {} {}\n{}",
            self.name, self.synopsis, self.help
        )
    }

    /// A usage error of this verb of `program`: what is wrong and the
    /// verb's usage on stderr, exit status 2.
    pub fn usage_error(&self, program: &str, problem: &str) -> ExitCode {
        let usage = self.usage(program);
        let _ = write!(std::io::stderr(), "{program}: {problem}\n{usage}");
        ExitCode::from(2)
    }
}

/// What `--version` prints: the version, the CNI spec versions, and the
/// flavour the binary was built in.
fn version(program: &str) -> String {
    let flavour = if cfg!(feature = "verbose") {
        "verbose"
    } else {
        "standard"
    };
    format!(
        "{program} {} ({flavour} flavour)\nCNI spec versions: {}\n",
        env!("CARGO_PKG_VERSION"),
        cni::SUPPORTED.join(", ")
    )
}

/// Prints `text` on stdout: exit status 0, unless it cannot be written.
fn print(text: &str) -> ExitCode {
    match std::io::stdout().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// For each binary's tests: every verb's synopsis names exactly the
/// options it takes, so that usage and help cannot drift from parsing.
#[cfg(test)]
pub fn assert_synopses(program: &Program) {
    for verb in program.verbs {
        let mut named: Vec<&str> = verb
            .synopsis
            .split(|c: char| c.is_whitespace() || "[]()|".contains(c))
            .filter(|word| word.starts_with("--"))
            .collect();
        named.sort();
        named.dedup();
        let mut taken: Vec<&str> = verb.options.iter().map(|o| o.name).collect();
        taken.sort();
        assert_eq!(named, taken, "{} {}", program.name, verb.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERB: Verb = Verb {
        name: "release",
        synopsis: "--config PATH [--dry-run] ADDRESS",
        options: &[Opt::value("--config"), Opt::flag("--dry-run")],
        operands: true,
        help: "Gives ADDRESS back.\n",
        run: |_| Ok(ExitCode::SUCCESS),
    };

    #[test]
    fn options_take_their_values_in_either_form_and_flags_none() {
        let options = VERB
            .parse_words(&["--config", "a", "10.1.0.5", "--dry-run", "--config=b"])
            .unwrap();
        assert_eq!(options.value("--config"), Some("b"));
        assert!(options.flag("--dry-run"));
        assert_eq!(options.operands(), ["10.1.0.5"]);
        assert_eq!(
            options.to_args(),
            ["--config=a", "--dry-run", "--config=b", "10.1.0.5"]
        );
        let none = VERB.parse(&[]).unwrap();
        assert_eq!(
            (none.value("--config"), none.flag("--dry-run")),
            (None, false)
        );
    }

    #[test]
    fn what_is_wrong_is_said_in_one_line() {
        for (list, problem) in [
            (&["--config"][..], "--config needs a value"),
            (&["--bogus"], "unknown option \"--bogus\""),
            (&["--dry-run=yes"], "unknown option \"--dry-run=yes\""),
            (&["-x"], "unknown option \"-x\""),
        ] {
            assert_eq!(VERB.parse_words(list).unwrap_err(), problem, "{list:?}");
        }
        let no_operands = Verb {
            operands: false,
            ..VERB
        };
        assert_eq!(
            no_operands.parse_words(&["10.1.0.5"]).unwrap_err(),
            "unknown option \"10.1.0.5\""
        );
    }

    #[test]
    fn usage_and_help_come_from_the_verbs() {
        let program = Program {
            name: "ipam-x",
            purpose: "a plugin",
            description: "As a plugin, it reads no arguments.\n",
            verbs: &[VERB],
            notes: "PATH is a conflist.\n",
        };
        assert_eq!(
            program.usage(),
            "usage:\n  ipam-x release --config PATH [--dry-run] ADDRESS\n  ipam-x --help | --version\n"
        );
        let help = program.help();
        assert!(help.starts_with("ipam-x: a plugin\n\nAs a plugin, it reads no arguments.\n\nCommands:\n  release --config PATH [--dry-run] ADDRESS\n          Gives ADDRESS back.\n\nPATH is a conflist.\n"), "{help}");
        assert!(help
            .ends_with("  --version  the version, the CNI spec versions it speaks, its flavour\n"));
    }
}
