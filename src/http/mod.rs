//! Just enough HTTP/1.1 for the peers the plugins talk to: a server
//! answering Docker's plugin client (a request's method, path and body,
//! and an answer) and a client of etcd's JSON gateway and of a network
//! controller's REST API (a request, and its answer's status, headers and
//! body: [`client`], over TLS with [`tls`]). Both sides frame messages the
//! same way: a start line, headers, a body sized by Content-Length or
//! chunked, on a connection that may be kept alive; every line, header
//! count and body bounded.

pub mod capped;
pub mod client;
pub mod socket;
pub mod tls;

use std::io::{self, BufRead, Read, Write};

/// How much a reader takes before it calls the peer broken.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The longest start or header line.
    pub line: usize,
    /// The most header lines one message may have.
    pub headers: usize,
    /// The largest body.
    pub body: usize,
}

/// One request.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    /// Whether the client wants the connection closed after the answer.
    pub close: bool,
}

/// The statuses a server answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Answered, whether the request succeeded or not: libnetwork reads
    /// a failure from the body.
    Ok,
    /// Not a request this reader takes.
    BadRequest,
    /// A path the API does not have.
    NotFound,
    /// The server cannot answer as it should for now.
    Unavailable,
}

/// What a message's headers say of its body and its connection, and all
/// of them as they came.
struct Head {
    length: Option<usize>,
    chunked: bool,
    /// `Connection: close` (`Some(true)`) or `keep-alive` (`Some(false)`).
    close: Option<bool>,
    headers: Vec<(String, String)>,
}

/// An answer a client read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// Its headers, names as sent, values trimmed.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the server closes the connection after it.
    pub close: bool,
}

impl Answer {
    /// The value of header `name` (any case), if the answer has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// Reads the next request from `input`; `None` when the client closed
/// the connection between requests. A request that breaks the rules (or
/// the limits) is an `InvalidData` error: answer 400 and close.
pub fn read_request(input: &mut impl BufRead, limits: Limits) -> io::Result<Option<Request>> {
    let Some(line) = read_line(input, limits)? else {
        return Ok(None);
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid(format!("not a request line: {line:?}")));
    };
    let http_1_0 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(invalid(format!("unsupported version {version:?}"))),
    };
    let head = read_head(input, limits)?;
    // A request without a length has no body.
    let body = read_body(input, &head, head.length.unwrap_or(0), limits)?;
    Ok(Some(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        body,
        close: head.close.unwrap_or(http_1_0),
    }))
}

/// Writes an answer with a body of `content_type`.
pub fn write_response(
    out: &mut impl Write,
    status: Status,
    content_type: &str,
    body: &[u8],
    close: bool,
) -> io::Result<()> {
    let status = match status {
        Status::Ok => "200 OK",
        Status::BadRequest => "400 Bad Request",
        Status::NotFound => "404 Not Found",
        Status::Unavailable => "503 Service Unavailable",
    };
    let connection = if close { "close" } else { "keep-alive" };
    let mut answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body);
    out.write_all(&answer)?;
    out.flush()
}

/// Writes a request for `path` on `host`, the connection kept, with
/// `headers` and, if there is one, a JSON `body`. A request line or a
/// header that would not be one line of printable text (a peer's token or
/// ID with a line break in it, that would add a header or a request of
/// its own) is refused with `InvalidInput` before anything is written, so
/// the connection stays fit for the next request.
pub fn write_request(
    out: &mut impl Write,
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<()> {
    let token = |what: &str, text: &str| -> io::Result<()> {
        if text.is_empty() || text.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} {text:?} is not one word of printable text"),
            ));
        }
        Ok(())
    };
    token("the method", method)?;
    token("the path", path)?;
    token("the Host", host)?;
    for (name, value) in headers {
        token("a header's name", name)?;
        // A value may have inner spaces and tabs, nothing else below 0x20.
        if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "header {name} holds a control character (a line break, a carriage return …)"
                ),
            ));
        }
    }
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    out.write_all(body.unwrap_or_default())?;
    out.flush()
}

/// Reads an answer whole: its status, headers and body. The connection
/// closing before it is whole is an `UnexpectedEof` error; an answer that
/// breaks the rules or the limits, `InvalidData`.
pub fn read_answer(input: &mut impl BufRead, limits: Limits) -> io::Result<Answer> {
    let line = read_line(input, limits)?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed"))?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid(format!("not an HTTP answer: {line:?}")))?;
    let mut head = read_head(input, limits)?;
    // HTTP/1.0 closes after each answer unless it says otherwise.
    let close = head.close.unwrap_or(line.starts_with("HTTP/1.0"));
    // 204 and 304 have no body, whatever their headers say; an answer
    // with neither length nor chunks ends with its connection, which is
    // then not kept.
    let body = match (head.length, head.chunked) {
        _ if status == 204 || status == 304 => Vec::new(),
        (Some(length), _) => read_body(input, &head, length, limits)?,
        (None, true) => read_body(input, &head, 0, limits)?,
        (None, false) if close => read_to_close(input, limits.body)?,
        (None, false) => return Err(invalid("an answer with neither length nor chunks".into())),
    };
    Ok(Answer {
        status,
        headers: std::mem::take(&mut head.headers),
        body,
        close,
    })
}

/// The header lines, up to the empty line that ends them.
fn read_head(input: &mut impl BufRead, limits: Limits) -> io::Result<Head> {
    let mut head = Head {
        length: None,
        chunked: false,
        close: None,
        headers: Vec::new(),
    };
    for _ in 0..=limits.headers {
        let line =
            read_line(input, limits)?.ok_or_else(|| invalid("the headers end early".into()))?;
        if line.is_empty() {
            return Ok(head);
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| invalid(format!("not a header: {line:?}")))?;
        let value = value.trim();
        head.headers.push((name.to_owned(), value.to_owned()));
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| invalid(format!("Content-Length {value:?}")))?;
            head.length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked = value.eq_ignore_ascii_case("chunked");
            if !head.chunked {
                return Err(invalid(format!("Transfer-Encoding {value:?}")));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            if value.eq_ignore_ascii_case("close") {
                head.close = Some(true);
            } else if value.eq_ignore_ascii_case("keep-alive") {
                head.close = Some(false);
            }
        }
    }
    Err(invalid(format!("more than {} headers", limits.headers)))
}

/// The body the head announces: chunked, or `length` bytes.
fn read_body(
    input: &mut impl BufRead,
    head: &Head,
    length: usize,
    limits: Limits,
) -> io::Result<Vec<u8>> {
    if head.chunked {
        read_chunked(input, limits)
    } else {
        read_exactly(input, length, limits.body)
    }
}

/// A line without its CRLF (or LF); `None` at the end of the input before
/// any byte of it.
fn read_line(input: &mut impl BufRead, limits: Limits) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    input
        .by_ref()
        .take(limits.line as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Ok(None);
    }
    if line.pop() != Some(b'\n') {
        return Err(invalid(if line.len() >= limits.line {
            format!("a line longer than {} bytes", limits.line)
        } else {
            "the connection closed inside a line".into()
        }));
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    String::from_utf8(line)
        .map(Some)
        .map_err(|_| invalid("a line that is not UTF-8".into()))
}

/// A body that ends with its connection, at most `max` bytes.
fn read_to_close(input: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    input.take(max as u64 + 1).read_to_end(&mut body)?;
    if body.len() > max {
        return Err(invalid(format!("a body over {max} bytes")));
    }
    Ok(body)
}

fn read_exactly(input: &mut impl Read, length: usize, max: usize) -> io::Result<Vec<u8>> {
    if length > max {
        return Err(invalid(format!("a body of {length} bytes")));
    }
    let mut body = vec![0; length];
    input.read_exact(&mut body)?;
    Ok(body)
}

fn read_chunked(input: &mut impl BufRead, limits: Limits) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(input, limits)?.ok_or_else(|| invalid("a chunk is missing".into()))?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("a chunk size {size:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(input, limits)?.unwrap_or_default().is_empty() {}
            return Ok(body);
        }
        if size > limits.body - body.len() {
            return Err(invalid(format!("a body over {} bytes", limits.body)));
        }
        body.extend(read_exactly(input, size, limits.body)?);
        if read_line(input, limits)?.as_deref() != Some("") {
            return Err(invalid("a chunk longer than its size".into()));
        }
    }
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Docker's requests are a few hundred bytes.
    const LIMITS: Limits = Limits {
        line: 8 * 1024,
        headers: 128,
        body: 1 << 20,
    };

    fn read(text: &[u8]) -> io::Result<Option<Request>> {
        read_request(&mut io::Cursor::new(text), LIMITS)
    }

    #[test]
    fn a_go_client_request_is_read_and_the_next_one_after_it() {
        let two = b"POST /IpamDriver.RequestPool HTTP/1.1\r\nHost: plugin\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 2\r\nAccept: application/vnd.docker.plugins.v1.2+json\r\n\r\n{}POST /Plugin.Activate HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut input = io::Cursor::new(&two[..]);
        let first = read_request(&mut input, LIMITS).unwrap().unwrap();
        assert_eq!(
            first,
            Request {
                method: "POST".into(),
                path: "/IpamDriver.RequestPool".into(),
                body: b"{}".to_vec(),
                close: false,
            }
        );
        let second = read_request(&mut input, LIMITS).unwrap().unwrap();
        assert_eq!(
            (second.path.as_str(), second.body.len()),
            ("/Plugin.Activate", 0)
        );
        assert_eq!(read_request(&mut input, LIMITS).unwrap(), None);
    }

    #[test]
    fn chunked_bodies_and_connection_close_are_understood() {
        let request = read(b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;x=1\r\n{\"a\r\n4\r\n\":1}\r\n0\r\nTrailer: t\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(request.body, b"{\"a\":1}");
        assert!(request.close);
        let old = read(b"POST /a HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(old.close);
        let kept = read(b"POST /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!kept.close);
    }

    #[test]
    fn broken_or_oversized_requests_are_refused() {
        let huge_chunk = format!(
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n{:x}\r\n",
            usize::MAX
        );
        let long_line = format!("POST /{} HTTP/1.1\r\n\r\n", "a".repeat(LIMITS.line));
        let many_headers = format!(
            "POST / HTTP/1.1\r\n{}\r\n",
            "A: b\r\n".repeat(LIMITS.headers + 1)
        );
        for bad in [
            &b"GARBAGE\r\n\r\n"[..],
            b"POST / HTTP/2\r\n\r\n",
            b"POST / HTTP/1.1\r\nno colon\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n{}",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: x",
            long_line.as_bytes(),
            many_headers.as_bytes(),
            huge_chunk.as_bytes(),
        ] {
            assert!(read(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn answers_carry_their_length_and_whether_the_connection_stays() {
        let mut out = Vec::new();
        write_response(&mut out, Status::Ok, "application/json", b"{}", false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 2\r\n"), "{text}");
        assert!(text.contains("Connection: keep-alive\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{}"), "{text}");
    }

    #[test]
    fn an_answer_is_read_by_its_length_or_its_chunks_and_a_broken_one_refused() {
        let mut two = io::Cursor::new(&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n"[..]);
        let first = read_answer(&mut two, LIMITS).unwrap();
        assert_eq!((first.status, first.body), (200, b"{}".to_vec()));
        let second = read_answer(&mut two, LIMITS).unwrap();
        assert_eq!((second.status, second.body), (503, b"{\"a\":1}".to_vec()));
        let closed = read_answer(&mut two, LIMITS).unwrap_err();
        assert_eq!(closed.kind(), io::ErrorKind::UnexpectedEof);
        for bad in [
            &b"HTTP/1.1 200 OK\r\n\r\n"[..],
            b"garbage\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{}",
            b"HTTP/1.1 200 OK\r\nContent-",
        ] {
            let e = read_answer(&mut io::Cursor::new(bad), LIMITS);
            assert!(e.is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_request_says_its_headers_and_its_length() {
        let mut out = Vec::new();
        write_request(
            &mut out,
            "POST",
            "127.0.0.1",
            "/v3/kv/range",
            &[],
            Some(b"{}"),
        )
        .unwrap();
        assert_eq!(
            out,
            b"POST /v3/kv/range HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
        let mut out = Vec::new();
        write_request(&mut out, "GET", "h", "/metrics", &[], None).unwrap();
        assert_eq!(out, b"GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n");
        let mut out = Vec::new();
        let token = [("X-Auth-Token", "tok.1")];
        write_request(&mut out, "DELETE", "h", "/p", &token, None).unwrap();
        assert_eq!(
            out,
            b"DELETE /p HTTP/1.1\r\nHost: h\r\nX-Auth-Token: tok.1\r\n\r\n"
        );
    }

    #[test]
    fn an_answer_keeps_its_headers_and_a_204_has_no_body() {
        let answer = read_answer(
            &mut io::Cursor::new(&b"HTTP/1.1 204 No Content\r\nDate: Thu, 26 Nov 2026 18:00:00 GMT\r\nConnection: close\r\n\r\n"[..]),
            LIMITS,
        )
        .unwrap();
        assert_eq!(answer.status, 204);
        assert!(answer.body.is_empty() && answer.close);
        assert_eq!(answer.header("date"), Some("Thu, 26 Nov 2026 18:00:00 GMT"));
        assert_eq!(answer.header("X-Subject-Token"), None);
        // HTTP/1.0 closes unless it says otherwise, and a body without a
        // length then ends with the connection.
        let old = read_answer(
            &mut io::Cursor::new(
                &b"HTTP/1.0 201 CREATED\r\nX-Subject-Token: t\r\n\r\n{\"token\":{}}"[..],
            ),
            LIMITS,
        )
        .unwrap();
        assert!(old.close);
        assert_eq!(
            (old.status, old.body.as_slice()),
            (201, &b"{\"token\":{}}"[..])
        );
        let kept = read_answer(
            &mut io::Cursor::new(
                &b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n"[..],
            ),
            LIMITS,
        )
        .unwrap();
        assert!(!kept.close);
    }
}
