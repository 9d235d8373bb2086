//! Command lines, for when a binary is not run as a CNI plugin: each
//! binary's verbs defined once (name, synopsis, options, what it does,
//! and the function that runs it), and from that one definition its
//! usage, its `--help` text (the binary's and each verb's), its manual
//! page and the parsing of its options.

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
    /// The one command of a binary that has no verbs: its options follow
    /// the binary's name (`ipam-delegated-docker --config PATH`).
    pub command: Option<&'static Verb>,
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
            return match self.command {
                Some(command) => self.run(command, self.name, &args),
                None => skel::about(self.name, self.purpose),
            };
        };
        let alone = args.len() == 1;
        match (first.to_str(), self.command) {
            (Some("--help" | "-h" | "help"), _) if alone => print(&self.help()),
            (Some("--version" | "-V"), _) if alone => print(&version(self.name)),
            (Some("--generate-man"), _) if alone => print(&self.man()),
            (_, Some(command)) => self.run(command, self.name, &args),
            (Some(name), None) => match self.verbs.iter().find(|v| v.name == name) {
                Some(verb) => self.run(verb, &format!("{} {name}", self.name), &args[1..]),
                None => self.usage_error(&format!("unknown command {name:?}")),
            },
            (None, None) => self.usage_error(&format!("unknown command {first:?}")),
        }
    }

    /// Runs `verb`, as `invoked` (the binary and the verb's name) names
    /// it, with `args`: its usage for `--help` or `-h` among them.
    fn run(&self, verb: &Verb, invoked: &str, args: &[OsString]) -> ExitCode {
        if args.iter().any(|a| a == "--help" || a == "-h") {
            return print(&verb.usage(invoked));
        }
        match verb.parse(args).and_then(|o| (verb.run)(&o)) {
            Ok(status) => status,
            Err(problem) => usage_error(invoked, &problem),
        }
    }

    /// One line per verb (or the binary's one command), and --help,
    /// --version and --generate-man.
    pub fn usage(&self) -> String {
        let mut usage = String::from("usage:\n");
        for (name, synopsis) in self.synopses() {
            usage.push_str(&format!("  {name} {synopsis}\n"));
        }
        usage.push_str(&format!(
            "  {} --help | --version | --generate-man\n",
            self.name
        ));
        usage
    }

    /// Each way to run it, as usage shows it: the binary with each verb,
    /// and that verb's synopsis.
    fn synopses(&self) -> Vec<(String, &'static str)> {
        match self.command {
            Some(command) => vec![(self.name.to_owned(), command.synopsis)],
            None => self
                .verbs
                .iter()
                .map(|verb| (format!("{} {}", self.name, verb.name), verb.synopsis))
                .collect(),
        }
    }

    /// What `--help` prints: the description, each verb with what it
    /// does, the notes.
    pub fn help(&self) -> String {
        let mut help = format!("{}: {}\n\n{}", self.name, self.purpose, self.description);
        if let Some(command) = self.command {
            help.push_str(&format!("\nUsage: {} {}\n", self.name, command.synopsis));
            help.push_str(&indented(command.help));
        }
        if !self.verbs.is_empty() {
            help.push_str("\nCommands:\n");
        }
        for verb in self.verbs {
            help.push_str(&format!("  {} {}\n", verb.name, verb.synopsis));
            help.push_str(&indented(verb.help));
        }
        if !self.notes.is_empty() {
            help.push('\n');
            help.push_str(self.notes);
        }
        help.push_str("\n  --help          this text (after a command: that command's)\n  --version       the version, the CNI spec versions it speaks, its flavour\n  --generate-man  this text as a manual page (roff)\n");
        help
    }

    /// Its manual page, in roff (man(7)), from the same definitions as
    /// `--help`.
    pub fn man(&self) -> String {
        let mut page = format!(
            ".TH {} 1 \"\" \"ipam-delegated {}\" \"CNI plugins\"\n.SH NAME\n{} \\- {}\n.SH SYNOPSIS\n",
            self.name.to_uppercase(),
            env!("CARGO_PKG_VERSION"),
            self.name,
            roff(self.purpose)
        );
        for (name, synopsis) in self.synopses() {
            page.push_str(&format!(".B {name}\n{}\n.br\n", roff(synopsis)));
        }
        page.push_str(&format!(
            ".B {}\n\\-\\-help | \\-\\-version | \\-\\-generate\\-man\n.SH DESCRIPTION\n{}",
            self.name,
            paragraphs(self.description)
        ));
        if let Some(command) = self.command {
            page.push_str(&paragraphs(command.help));
        }
        if !self.verbs.is_empty() {
            page.push_str(".SH COMMANDS\n");
        }
        for verb in self.verbs {
            page.push_str(&format!(
                ".TP\n.B {} {}\n{}",
                verb.name,
                roff(verb.synopsis),
                paragraphs(verb.help)
            ));
        }
        if !self.notes.is_empty() {
            page.push_str(&format!(".SH NOTES\n{}", paragraphs(self.notes)));
        }
        page.push_str(MAN_END);
        page
    }

    /// A usage error of the binary: what is wrong, and what to read.
    pub fn usage_error(&self, problem: &str) -> ExitCode {
        usage_error(self.name, problem)
    }
}

/// The end of every manual page: the options every binary takes, exit
/// statuses, the family.
const MAN_END: &str = "\
.SH OPTIONS
.TP
.B \\-\\-help
This text, on standard output; after a command, that command's.
.TP
.B \\-\\-version
The version, the CNI spec versions it speaks, and its flavour.
.TP
.B \\-\\-generate\\-man
This manual page.
.SH EXIT STATUS
0 on success; 1 when something failed or is left to settle (said on
standard error, with its CNI code); 2 for a command line it cannot use.
.SH SEE ALSO
.BR ipam-delegated (1),
.BR ipam-ds-static (1),
.BR ipam-da-pool (1),
.BR ipam-delegated-docker (1)
";

/// A usage error of `invoked` (a binary, or a binary and its verb): what
/// is wrong and the `--help` to read, in one line on stderr; exit status 2.
pub fn usage_error(invoked: &str, problem: &str) -> ExitCode {
    let _ = writeln!(
        std::io::stderr(),
        "{invoked}: {problem} (see '{invoked} --help')"
    );
    ExitCode::from(2)
}

/// Help text indented under its synopsis.
fn indented(text: &str) -> String {
    text.lines()
        .map(|line| match line.is_empty() {
            true => "\n".to_owned(),
            false => format!("          {line}\n"),
        })
        .collect()
}

/// Text as roff paragraphs: a blank line starts a new one.
fn paragraphs(text: &str) -> String {
    text.split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .map(|p| format!(".PP\n{}\n", roff(p.trim_end())))
        .collect()
}

/// Text that roff prints as written: backslashes and hyphens escaped, and
/// no line starting with a control character.
fn roff(text: &str) -> String {
    text.replace('\\', "\\e")
        .replace('-', "\\-")
        .lines()
        .map(|line| match line.starts_with(['.', '\'']) {
            true => format!("\\&{line}"),
            false => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
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

    /// Its usage, as `invoked` (the binary, and the verb's name if it
    /// has verbs) runs it, and what it does.
    pub fn usage(&self, invoked: &str) -> String {
        format!("usage: {invoked} {}\n{}", self.synopsis, self.help)
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

/// How an operator's verb ends: exit 0 when all went well, 1 when
/// something is left to settle (or nothing matched) or an error stopped
/// it, said on stderr as `PROGRAM: ERROR (code N)`.
pub fn finish<E: cni::Reportable>(program: &str, outcome: Result<bool, E>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{program}: {e} (code {})", e.code());
            ExitCode::FAILURE
        }
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
            command: None,
        };
        assert_eq!(
            program.usage(),
            "usage:\n  ipam-x release --config PATH [--dry-run] ADDRESS\n  ipam-x --help | --version | --generate-man\n"
        );
        let help = program.help();
        assert!(help.starts_with("ipam-x: a plugin\n\nAs a plugin, it reads no arguments.\n\nCommands:\n  release --config PATH [--dry-run] ADDRESS\n          Gives ADDRESS back.\n\nPATH is a conflist.\n"), "{help}");
        assert!(help.ends_with("  --generate-man  this text as a manual page (roff)\n"));
        // The manual page says what --help says, escaped for roff.
        let man = program.man();
        assert!(man.starts_with(".TH IPAM-X 1 "), "{man}");
        assert!(
            man.contains(".B ipam-x release\n\\-\\-config PATH [\\-\\-dry\\-run] ADDRESS\n"),
            "{man}"
        );
        assert!(man.contains(".SH COMMANDS\n.TP\n.B release "), "{man}");
        assert!(man.contains(".PP\nGives ADDRESS back.\n"), "{man}");
        assert!(
            man.contains(".SH NOTES\n.PP\nPATH is a conflist.\n"),
            "{man}"
        );
        // A binary of one command shows it after its name.
        let alone = Program {
            verbs: &[],
            command: Some(&VERB),
            ..program
        };
        assert!(alone.usage().starts_with("usage:\n  ipam-x --config PATH"));
        assert!(alone.help().contains(
            "\nUsage: ipam-x --config PATH [--dry-run] ADDRESS\n          Gives ADDRESS back.\n"
        ));
        assert!(!alone.man().contains(".SH COMMANDS"));
    }

    #[test]
    fn text_is_escaped_for_roff() {
        assert_eq!(roff("a-b \\n"), "a\\-b \\en");
        assert_eq!(roff(".TH x\n'quote"), "\\&.TH x\n\\&'quote");
        assert_eq!(
            paragraphs("one\ntwo\n\nthree\n"),
            ".PP\none\ntwo\n.PP\nthree\n"
        );
    }
}
