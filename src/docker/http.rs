//! Just enough HTTP/1.1 to answer Docker's plugin client: read a request
//! (its method, path and body, sized by Content-Length or chunked) and
//! write an answer, on a connection the client may keep alive.

use std::io::{self, BufRead, Read, Write};

/// The longest request, status or header line read.
const MAX_LINE: usize = 8 * 1024;

/// The most header lines one request may have.
const MAX_HEADERS: usize = 128;

/// The largest body read: Docker's requests are a few hundred bytes.
const MAX_BODY: usize = 1 << 20;

/// One request.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    /// Whether the client wants the connection closed after the answer.
    pub close: bool,
}

/// Reads the next request from `input`; `None` when the client closed
/// the connection between requests. A request that breaks the rules (or
/// the bounds above) is an `InvalidData` error: answer 400 and close.
pub fn read_request(input: &mut impl BufRead) -> io::Result<Option<Request>> {
    let Some(line) = read_line(input)? else {
        return Ok(None);
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid(format!("not a request line: {line:?}")));
    };
    let mut close = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(invalid(format!("unsupported version {version:?}"))),
    };
    let mut length = None;
    let mut chunked = false;
    for _ in 0..=MAX_HEADERS {
        let line = read_line(input)?.ok_or_else(|| invalid("the headers end early".into()))?;
        if line.is_empty() {
            let body = if chunked {
                read_chunked(input)?
            } else {
                read_exactly(input, length.unwrap_or(0))?
            };
            return Ok(Some(Request {
                method: method.to_owned(),
                path: path.to_owned(),
                body,
                close,
            }));
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| invalid(format!("not a header: {line:?}")))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| invalid(format!("Content-Length {value:?}")))?;
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
            if !chunked {
                return Err(invalid(format!("Transfer-Encoding {value:?}")));
            }
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close")
                || (close && !value.eq_ignore_ascii_case("keep-alive"));
        }
    }
    Err(invalid(format!("more than {MAX_HEADERS} headers")))
}

/// The statuses the driver answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Answered, whether the request succeeded or not: libnetwork reads
    /// a failure from the body.
    Ok,
    /// Not a request this reader takes.
    BadRequest,
    /// A path the API does not have.
    NotFound,
}

/// Writes an answer with a JSON body.
pub fn write_response(
    out: &mut impl Write,
    status: Status,
    body: &[u8],
    close: bool,
) -> io::Result<()> {
    let status = match status {
        Status::Ok => "200 OK",
        Status::BadRequest => "400 Bad Request",
        Status::NotFound => "404 Not Found",
    };
    let connection = if close { "close" } else { "keep-alive" };
    let mut answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/vnd.docker.plugins.v1+json\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body);
    out.write_all(&answer)?;
    out.flush()
}

/// A line without its CRLF (or LF); `None` at the end of the input before
/// any byte of it.
fn read_line(input: &mut impl BufRead) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    input
        .by_ref()
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Ok(None);
    }
    if line.pop() != Some(b'\n') {
        return Err(invalid(if line.len() >= MAX_LINE {
            format!("a line longer than {MAX_LINE} bytes")
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

fn read_exactly(input: &mut impl Read, length: usize) -> io::Result<Vec<u8>> {
    if length > MAX_BODY {
        return Err(invalid(format!("a body of {length} bytes")));
    }
    let mut body = vec![0; length];
    input.read_exact(&mut body)?;
    Ok(body)
}

fn read_chunked(input: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(input)?.ok_or_else(|| invalid("a chunk is missing".into()))?;
        let size = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("a chunk size {size:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            while !read_line(input)?.unwrap_or_default().is_empty() {}
            return Ok(body);
        }
        if size > MAX_BODY - body.len() {
            return Err(invalid(format!("a body over {MAX_BODY} bytes")));
        }
        body.extend(read_exactly(input, size)?);
        if read_line(input)?.as_deref() != Some("") {
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

    fn read(text: &[u8]) -> io::Result<Option<Request>> {
        read_request(&mut io::Cursor::new(text))
    }

    #[test]
    fn a_go_client_request_is_read_and_the_next_one_after_it() {
        let two = b"POST /IpamDriver.RequestPool HTTP/1.1\r\nHost: plugin\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: 2\r\nAccept: application/vnd.docker.plugins.v1.2+json\r\n\r\n{}POST /Plugin.Activate HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut input = io::Cursor::new(&two[..]);
        let first = read_request(&mut input).unwrap().unwrap();
        assert_eq!(
            first,
            Request {
                method: "POST".into(),
                path: "/IpamDriver.RequestPool".into(),
                body: b"{}".to_vec(),
                close: false,
            }
        );
        let second = read_request(&mut input).unwrap().unwrap();
        assert_eq!(
            (second.path.as_str(), second.body.len()),
            ("/Plugin.Activate", 0)
        );
        assert_eq!(read_request(&mut input).unwrap(), None);
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
        let long_line = format!("POST /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_LINE));
        let many_headers = format!(
            "POST / HTTP/1.1\r\n{}\r\n",
            "A: b\r\n".repeat(MAX_HEADERS + 1)
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
        write_response(&mut out, Status::Ok, b"{}", false).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(text.contains("Content-Length: 2\r\n"), "{text}");
        assert!(text.contains("Connection: keep-alive\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{}"), "{text}");
    }
}
