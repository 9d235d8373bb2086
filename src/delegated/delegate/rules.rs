//! The rules of a stack of delegates, whatever runs them: ADD threads each
//! result into the next one's input and undoes the stack when one fails;
//! DEL passes on what each delegate prints and is best effort; GC is best
//! effort but passes nothing on; CHECK and STATUS stop at the first
//! failure.

use std::time::Duration;

use tracing::warn;

use super::lookup::Delegate;
use super::runner::{Call, Limits, Runner};
use crate::cni::{self, Command, NetConf, Reportable};
use crate::delegated::error::{DelegatedError, Failure};

/// A configuration's stack, run by `runner`.
pub struct Chain<'a, R> {
    net: &'a NetConf<'a>,
    runner: &'a R,
    timeout: Option<Duration>,
}

impl<'a, R: Runner> Chain<'a, R> {
    /// The stack for configuration `net`, each call bounded by `timeout`.
    pub fn new(net: &'a NetConf<'a>, runner: &'a R, timeout: Option<Duration>) -> Self {
        Chain {
            net,
            runner,
            timeout,
        }
    }

    /// The limits of every call the runtime asked for: wound down by a
    /// first termination request.
    fn asked(&self) -> Limits {
        Limits {
            timeout: self.timeout,
            stopped_by: 1,
        }
    }

    /// The limits of a rollback DEL: stopped only by a second request;
    /// stopping it after the first would leak what it is undoing.
    fn undoing(&self) -> Limits {
        Limits {
            stopped_by: 2,
            ..self.asked()
        }
    }

    /// Runs `command` on `delegate`; a failure comes back naming it.
    fn call(
        &self,
        delegate: &Delegate,
        command: Command,
        stdin: &[u8],
        limits: Limits,
        buffer: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, DelegatedError> {
        let call = Call {
            command,
            stdin,
            limits,
            buffer,
        };
        self.runner
            .run(delegate, call)
            .map_err(|failure| delegate.failed(command, failure))
    }

    /// ADD: delegate 1 gets the input as it came, each next one the
    /// previous one's result as `prevResult`; the last result is the
    /// answer, as printed or, if printed in another spec version,
    /// converted to the configuration's. If delegate k fails, delegates
    /// 1..=k get a DEL (see [`Self::rollback`]) and delegate k's error is
    /// the answer; if it was never started (the plugin was asked to stop
    /// first), 1..k.
    pub fn add(&self, delegates: &[Delegate]) -> Result<Vec<u8>, DelegatedError> {
        let mut thread = Thread::new(self.net);
        for (k, delegate) in delegates.iter().enumerate() {
            let buffer = thread.take_buffer();
            let error =
                match self.call(delegate, Command::Add, thread.input(), self.asked(), buffer) {
                    Ok(Some(result)) if k + 1 == delegates.len() => {
                        // Finished in the grace of a termination request: the
                        // ADD is undone all the same, as it would have been
                        // had the request come earlier.
                        let reply = match self.runner.stop_requested(self.asked().stopped_by) {
                            Some(signal) => Err(Failure::FinishedAfterStop(signal)),
                            None => cni::in_version(result, self.net.cni_version)
                                .map_err(Failure::Reply),
                        };
                        match reply {
                            Ok(reply) => return Ok(reply),
                            Err(failure) => delegate.failed(Command::Add, failure),
                        }
                    }
                    Ok(Some(result)) => {
                        thread.pass_on(result);
                        continue;
                    }
                    Ok(None) => delegate.failed(Command::Add, Failure::NoResult),
                    Err(error) => error,
                };
            // One that never started has nothing to undo.
            let ran = if error.never_ran() { k } else { k + 1 };
            warn!(
                "ADD failed, rolling back {ran} delegate(s): {}",
                error.summary()
            );
            return Err(error.with_rollback(self.rollback(&delegates[..ran], thread)));
        }
        // Only reachable with no delegates, which the configuration refuses.
        Err(cni::Error::InvalidConfig("\"ipam.delegates\" is empty".into()).into())
    }

    /// Undoes an ADD that succeeded but whose result the runtime will never
    /// see: DEL on every delegate, in order, the first getting the result
    /// as `prevResult`, as a runtime's DEL would. Returns the DELs that
    /// failed.
    pub fn undo(&self, delegates: &[Delegate], result: &[u8]) -> Vec<DelegatedError> {
        let mut thread = Thread::new(self.net);
        thread.input = Some(self.net.with_prev_result(result));
        self.rollback(delegates, thread)
    }

    /// Undoes a failed ADD: DEL on each delegate that was run, failed one
    /// included, in the same order. The first DEL gets `thread`'s input,
    /// what the failed delegate got; then results thread as in
    /// [`Self::del`]. Failures are logged and returned, and never stop the
    /// remaining DELs.
    fn rollback(&self, delegates: &[Delegate], mut thread: Thread) -> Vec<DelegatedError> {
        delegates
            .iter()
            .filter_map(|delegate| {
                let error = self
                    .step(&mut thread, delegate, Command::Del, self.undoing())
                    .err()?;
                warn!("rollback: {}", error.summary());
                Some(error)
            })
            .collect()
    }

    /// DEL, best effort: every delegate that was found runs, in order,
    /// whatever the others did. The first failure's code is the answer;
    /// all are listed.
    pub fn del(
        &self,
        delegates: Vec<Result<Delegate, DelegatedError>>,
    ) -> Result<(), DelegatedError> {
        let mut thread = Thread::new(self.net);
        let failures = delegates
            .into_iter()
            .filter_map(|found| {
                found
                    .and_then(|delegate| {
                        self.step(&mut thread, &delegate, Command::Del, self.asked())
                    })
                    .err()
            })
            .collect();
        DelegatedError::from_failures(failures)
    }

    /// CHECK: in order, threading results as DEL does; the first failure
    /// is the answer.
    pub fn check(&self, delegates: &[Delegate]) -> Result<(), DelegatedError> {
        let mut thread = Thread::new(self.net);
        for delegate in delegates {
            self.step(&mut thread, delegate, Command::Check, self.asked())?;
        }
        Ok(())
    }

    /// GC (CNI 1.1), best effort: every delegate that was found gets
    /// `input` (the configuration, with `cni.dev/valid-attachments`),
    /// whatever the others did. Nothing is threaded: each delegate cleans
    /// up its own store against the runtime's list. The first failure's
    /// code is the answer; all are listed.
    pub fn gc(
        &self,
        input: &[u8],
        delegates: Vec<Result<Delegate, DelegatedError>>,
    ) -> Result<(), DelegatedError> {
        let failures = delegates
            .into_iter()
            .filter_map(|found| {
                found
                    .and_then(|delegate| {
                        self.call(&delegate, Command::Gc, input, self.asked(), Vec::new())
                    })
                    .err()
            })
            .collect();
        DelegatedError::from_failures(failures)
    }

    /// STATUS (CNI 1.1): each delegate in order gets the input as it came;
    /// the first one not ready (50, 51 or any failure) is the answer, code
    /// kept.
    pub fn status(&self, delegates: &[Delegate]) -> Result<(), DelegatedError> {
        for delegate in delegates {
            self.call(
                delegate,
                Command::Status,
                self.net.raw,
                self.asked(),
                Vec::new(),
            )?;
        }
        Ok(())
    }

    /// One call of a threaded DEL or CHECK: a delegate that printed a
    /// result makes it the next one's `prevResult`; one that printed
    /// nothing leaves the next one's input as it was.
    fn step(
        &self,
        thread: &mut Thread,
        delegate: &Delegate,
        command: Command,
        limits: Limits,
    ) -> Result<(), DelegatedError> {
        let buffer = thread.take_buffer();
        if let Some(printed) = self.call(delegate, command, thread.input(), limits, buffer)? {
            thread.pass_on(printed);
        }
        Ok(())
    }
}

/// A chain's threading: the input the next delegate reads, and the buffer
/// the next output is read into. A result becomes the next input's
/// `prevResult`, and its allocation the next output's buffer, so two
/// buffers serve a chain of any length: memory stays at about the
/// configuration plus twice the output cap, the input being fed and the
/// output being read.
struct Thread<'a> {
    net: &'a NetConf<'a>,
    /// The next input; `None` for the configuration as it came.
    input: Option<Vec<u8>>,
    /// Where the next output is read.
    spare: Vec<u8>,
}

impl<'a> Thread<'a> {
    fn new(net: &'a NetConf<'a>) -> Thread<'a> {
        Thread {
            net,
            input: None,
            spare: Vec::new(),
        }
    }

    fn input(&self) -> &[u8] {
        self.input.as_deref().unwrap_or(self.net.raw)
    }

    fn take_buffer(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.spare)
    }

    /// Makes `result` the next input's `prevResult`.
    fn pass_on(&mut self, result: Vec<u8>) {
        let input = self.input.get_or_insert_with(Vec::new);
        self.net.write_with_prev_result(&result, input);
        self.spare = result;
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::{delegates, Answer, FakeRunner};
    use super::*;
    use crate::cni::code;

    const CONFIG: &str = r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"ipam-delegated","delegates":["a","b","c"]},"x":1.50}"#;

    fn net() -> NetConf<'static> {
        NetConf::parse(CONFIG.as_bytes()).unwrap()
    }

    /// The configuration with `prevResult` set, as delegates must read it.
    fn with_prev(result: &str) -> String {
        String::from_utf8(net().with_prev_result(result.as_bytes())).unwrap()
    }

    fn result(name: &str) -> String {
        format!(r#"{{"cniVersion":"1.0.0","ips":[],"by":"{name}"}}"#)
    }

    fn printing(names: &[&str], command: Command) -> FakeRunner {
        names.iter().fold(FakeRunner::default(), |fake, name| {
            fake.answer(name, command, Answer::Prints(result(name)))
        })
    }

    #[test]
    fn add_threads_each_result_into_the_next_input_and_answers_the_last() {
        let (net, fake) = (net(), printing(&["a", "b", "c"], Command::Add));
        let reply = Chain::new(&net, &fake, None).add(&delegates(&["a", "b", "c"]));
        assert_eq!(String::from_utf8(reply.unwrap()).unwrap(), result("c"));
        let calls = fake.calls();
        assert_eq!(calls[0].stdin, CONFIG);
        assert_eq!(calls[1].stdin, with_prev(&result("a")));
        assert_eq!(calls[2].stdin, with_prev(&result("b")));
    }

    #[test]
    fn the_reply_is_converted_to_the_configurations_version() {
        let net = net();
        let fake = FakeRunner::default().answer(
            "a",
            Command::Add,
            Answer::Prints(
                r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/24"}]}"#.into(),
            ),
        );
        let reply = Chain::new(&net, &fake, None)
            .add(&delegates(&["a"]))
            .unwrap();
        assert_eq!(
            reply,
            br#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}"#
        );
    }

    #[test]
    fn a_failed_add_is_undone_up_to_the_failed_delegate_in_order() {
        for failing in ["a", "b", "c"] {
            let net = net();
            let fake = printing(&["a", "b", "c"], Command::Add).answer(
                failing,
                Command::Add,
                Answer::Fails(11, "no lease"),
            );
            let error = Chain::new(&net, &fake, None)
                .add(&delegates(&["a", "b", "c"]))
                .unwrap_err();
            assert_eq!((error.code(), error.to_string()), (11, "no lease".into()));
            let ran = ["a", "b", "c"].iter().position(|n| *n == failing).unwrap() + 1;
            let mut expected: Vec<String> = ["a", "b", "c"][..ran]
                .iter()
                .map(|n| format!("{n} ADD"))
                .collect();
            expected.extend(["a", "b", "c"][..ran].iter().map(|n| format!("{n} DEL")));
            assert_eq!(fake.call_list(), expected, "{failing}");
            // The first DEL gets what the failed delegate got; silent DELs
            // pass it on unchanged.
            let calls = fake.calls();
            for del in &calls[ran..] {
                assert_eq!(del.stdin, calls[ran - 1].stdin, "{failing}");
            }
        }
    }

    #[test]
    fn rollback_dels_thread_what_they_print_and_failures_never_replace_the_code() {
        let net = net();
        let fake = printing(&["a", "b"], Command::Add)
            .answer("c", Command::Add, Answer::Fails(11, "no lease"))
            .answer("a", Command::Del, Answer::Prints(r#"{"freed":"a"}"#.into()))
            .answer("b", Command::Del, Answer::Fails(5, "store down"));
        let error = Chain::new(&net, &fake, None)
            .add(&delegates(&["a", "b", "c"]))
            .unwrap_err();
        assert_eq!(error.code(), 11);
        assert!(
            error
                .details()
                .contains("- b (DEL): failed with code 5: store down"),
            "{}",
            error.details()
        );
        let calls = fake.calls();
        assert_eq!(
            fake.call_list(),
            ["a ADD", "b ADD", "c ADD", "a DEL", "b DEL", "c DEL"]
        );
        assert_eq!(calls[3].stdin, with_prev(&result("b")));
        assert_eq!(calls[4].stdin, with_prev(r#"{"freed":"a"}"#));
        // b failed: c gets what b got.
        assert_eq!(calls[5].stdin, calls[4].stdin);
    }

    #[test]
    fn an_add_without_a_result_is_code_6_and_undone() {
        let (net, fake) = (net(), FakeRunner::default());
        let error = Chain::new(&net, &fake, None)
            .add(&delegates(&["a"]))
            .unwrap_err();
        assert_eq!(error.code(), code::DECODING_FAILURE);
        assert_eq!(
            error.to_string(),
            "a (ADD): succeeded but printed no result"
        );
        assert_eq!(fake.call_list(), ["a ADD", "a DEL"]);
    }

    #[test]
    fn a_delegate_never_started_is_not_undone() {
        // The request comes while a runs: a finishes, b never starts.
        let net = net();
        let fake = printing(&["a", "b"], Command::Add).request_after(1);
        let error = Chain::new(&net, &fake, None)
            .add(&delegates(&["a", "b"]))
            .unwrap_err();
        assert_eq!(error.code(), code::INTERRUPTED);
        assert_eq!(
            error.to_string(),
            "b (ADD): was not run: the plugin had received signal 15"
        );
        // The rollback is not cut short by a first request.
        assert_eq!(fake.call_list(), ["a ADD", "a DEL"]);
    }

    #[test]
    fn a_last_delegate_that_finishes_after_a_request_is_undone_too() {
        let net = net();
        let fake = printing(&["a", "b"], Command::Add).request_after(2);
        let error = Chain::new(&net, &fake, None)
            .add(&delegates(&["a", "b"]))
            .unwrap_err();
        assert_eq!(error.code(), code::INTERRUPTED);
        assert_eq!(fake.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
    }

    #[test]
    fn a_second_request_cuts_the_rollback_short() {
        let net = net();
        let fake = printing(&["a"], Command::Add)
            .answer("b", Command::Add, Answer::Stopped)
            .request_after(2)
            .request_after(3);
        let error = Chain::new(&net, &fake, None)
            .add(&delegates(&["a", "b"]))
            .unwrap_err();
        assert_eq!(error.code(), code::INTERRUPTED);
        assert!(
            error.details().contains("- b (DEL): was not run"),
            "{}",
            error.details()
        );
        assert_eq!(fake.call_list(), ["a ADD", "b ADD", "a DEL"]);
    }

    #[test]
    fn undo_dels_every_delegate_with_the_result_as_prev_result() {
        let (net, fake) = (net(), FakeRunner::default());
        let failed =
            Chain::new(&net, &fake, None).undo(&delegates(&["a", "b"]), result("b").as_bytes());
        assert!(failed.is_empty());
        assert_eq!(fake.call_list(), ["a DEL", "b DEL"]);
        for call in fake.calls() {
            assert_eq!(call.stdin, with_prev(&result("b")));
        }
    }

    #[test]
    fn del_threads_printed_results_and_is_best_effort() {
        let net = net();
        let fake = FakeRunner::default()
            .answer("a", Command::Del, Answer::Prints(r#"{"freed":"a"}"#.into()))
            .answer("b", Command::Del, Answer::Fails(11, "busy"));
        let found = vec![
            Ok(delegates(&["a"]).remove(0)),
            Err(DelegatedError::NotFound {
                name: "gone".into(),
                searched: "/x".into(),
            }),
            Ok(delegates(&["b"]).remove(0)),
            Ok(delegates(&["c"]).remove(0)),
        ];
        let error = Chain::new(&net, &fake, None).del(found).unwrap_err();
        // The first failure's code, every failure listed, every found delegate run.
        assert_eq!(error.code(), code::DELEGATE_NOT_FOUND);
        assert!(error
            .details()
            .contains("- b (DEL): failed with code 11: busy"));
        assert_eq!(fake.call_list(), ["a DEL", "b DEL", "c DEL"]);
        let calls = fake.calls();
        assert_eq!(calls[0].stdin, CONFIG);
        assert_eq!(calls[1].stdin, with_prev(r#"{"freed":"a"}"#));
        assert_eq!(calls[2].stdin, calls[1].stdin);
    }

    #[test]
    fn check_threads_printed_results_and_stops_at_the_first_failure() {
        let net = net();
        let fake = FakeRunner::default()
            .answer(
                "a",
                Command::Check,
                Answer::Prints(r#"{"checked":"a"}"#.into()),
            )
            .answer("b", Command::Check, Answer::Fails(3, "gone"));
        let error = Chain::new(&net, &fake, None)
            .check(&delegates(&["a", "b", "c"]))
            .unwrap_err();
        assert_eq!(error.code(), 3);
        assert_eq!(fake.call_list(), ["a CHECK", "b CHECK"]);
        assert_eq!(fake.calls()[1].stdin, with_prev(r#"{"checked":"a"}"#));
    }

    #[test]
    fn gc_gives_every_delegate_the_same_input_and_is_best_effort() {
        let net = net();
        let fake = FakeRunner::default()
            .answer(
                "a",
                Command::Gc,
                Answer::Prints(r#"{"ignored":true}"#.into()),
            )
            .answer("b", Command::Gc, Answer::Fails(11, "locked"));
        let input = br#"{"with":"valid-attachments"}"#;
        let error = Chain::new(&net, &fake, None)
            .gc(
                input,
                delegates(&["a", "b", "c"]).into_iter().map(Ok).collect(),
            )
            .unwrap_err();
        assert_eq!(error.code(), 11);
        assert_eq!(fake.call_list(), ["a GC", "b GC", "c GC"]);
        for call in fake.calls() {
            assert_eq!(call.stdin.as_bytes(), input);
        }
    }

    #[test]
    fn status_stops_at_the_first_delegate_not_ready_and_keeps_its_code() {
        let net = net();
        let fake =
            FakeRunner::default().answer("b", Command::Status, Answer::Fails(50, "not ready"));
        let error = Chain::new(&net, &fake, None)
            .status(&delegates(&["a", "b", "c"]))
            .unwrap_err();
        assert_eq!((error.code(), error.to_string()), (50, "not ready".into()));
        assert_eq!(fake.call_list(), ["a STATUS", "b STATUS"]);
        for call in fake.calls() {
            assert_eq!(call.stdin, CONFIG);
        }
    }

    #[test]
    fn every_call_is_bounded_and_only_rollback_dels_outlast_a_first_request() {
        let net = net();
        let fake = printing(&["a"], Command::Add).answer("b", Command::Add, Answer::Fails(11, "x"));
        let timeout = Some(Duration::from_millis(1500));
        let _ = Chain::new(&net, &fake, timeout).add(&delegates(&["a", "b"]));
        for call in fake.calls() {
            assert_eq!(call.limits.timeout, timeout, "{call:?}");
            let stopped_by = if call.command == Command::Del { 2 } else { 1 };
            assert_eq!(call.limits.stopped_by, stopped_by, "{call:?}");
        }
        assert_eq!(fake.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
        let fake = FakeRunner::default();
        Chain::new(&net, &fake, timeout)
            .del(vec![Ok(delegates(&["a"]).remove(0))])
            .unwrap();
        assert_eq!(
            fake.calls()[0].limits.stopped_by,
            1,
            "a runtime's DEL stops at the first"
        );
    }

    #[test]
    fn a_middle_delegate_without_a_result_fails_the_add_with_code_6() {
        let net = net();
        let fake = printing(&["a", "c"], Command::Add);
        let error = Chain::new(&net, &fake, None)
            .add(&delegates(&["a", "b", "c"]))
            .unwrap_err();
        assert_eq!(error.code(), code::DECODING_FAILURE);
        assert_eq!(
            error.to_string(),
            "b (ADD): succeeded but printed no result"
        );
        assert_eq!(fake.call_list(), ["a ADD", "b ADD", "a DEL", "b DEL"]);
    }

    #[test]
    fn a_last_result_that_cannot_be_the_reply_is_undone_with_its_code() {
        for (printed, code) in [
            (
                r#"{"cniVersion":"0.2.0","ip4":{}}"#,
                code::INCOMPATIBLE_VERSION,
            ),
            (r#"{"cniVersion":"1.0.0","ips":{}}"#, code::DECODING_FAILURE),
        ] {
            let config = r#"{"cniVersion":"0.4.0","name":"n","ipam":{}}"#;
            let net = NetConf::parse(config.as_bytes()).unwrap();
            let fake = printing(&["a"], Command::Add).answer(
                "b",
                Command::Add,
                Answer::Prints(printed.into()),
            );
            let error = Chain::new(&net, &fake, None)
                .add(&delegates(&["a", "b"]))
                .unwrap_err();
            assert_eq!(error.code(), code, "{printed}");
            assert_eq!(
                fake.call_list(),
                ["a ADD", "b ADD", "a DEL", "b DEL"],
                "{printed}"
            );
        }
    }

    #[test]
    fn undo_threads_what_its_dels_print_and_outlasts_a_first_request() {
        let net = net();
        let fake = FakeRunner::default()
            .answer("a", Command::Del, Answer::Prints(r#"{"freed":"a"}"#.into()))
            .request_after(0);
        let failed =
            Chain::new(&net, &fake, None).undo(&delegates(&["a", "b"]), result("b").as_bytes());
        assert!(failed.is_empty(), "{failed:?}");
        let calls = fake.calls();
        assert_eq!(fake.call_list(), ["a DEL", "b DEL"]);
        assert_eq!(calls[1].stdin, with_prev(r#"{"freed":"a"}"#));
        // A second request cuts it short.
        let fake = FakeRunner::default().request_after(0).request_after(1);
        let failed =
            Chain::new(&net, &fake, None).undo(&delegates(&["a", "b"]), result("b").as_bytes());
        assert_eq!(fake.call_list(), ["a DEL"]);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].code(), code::INTERRUPTED);
    }

    #[test]
    fn gc_runs_the_delegates_found_and_reports_the_missing_one() {
        let (net, fake) = (net(), FakeRunner::default());
        let found = vec![
            Err(DelegatedError::NotFound {
                name: "gone".into(),
                searched: "/x".into(),
            }),
            Ok(delegates(&["b"]).remove(0)),
        ];
        let error = Chain::new(&net, &fake, None).gc(b"{}", found).unwrap_err();
        assert_eq!(error.code(), code::DELEGATE_NOT_FOUND);
        assert_eq!(fake.call_list(), ["b GC"]);
    }
}
