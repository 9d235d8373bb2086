//! A client's connection to one server (an etcd member's JSON gateway, a
//! network controller's API), plain or TLS (with a client certificate),
//! kept alive from one request to the next, each bounded as a whole by a
//! deadline: the name's lookup, the connection, every read and write.

use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use super::socket::{interrupted, remaining, stopped, Socket};
use crate::http::{self, Answer, Limits};

/// A connection to one endpoint.
pub struct Connection {
    stream: BufReader<Stream>,
    /// The Host header's value: the host and its port.
    host: String,
    /// What an answer of this peer may be.
    limits: Limits,
}

/// The connection's stream: the socket, bare or under TLS. Either way
/// every socket read and write is bounded by what is left of the
/// request's time (see [`Socket`]).
enum Stream {
    Plain(Socket),
    Tls(Box<StreamOwned<ClientConnection, Socket>>),
}

impl Read for Stream {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(socket) => socket.read(buffer),
            Stream::Tls(stream) => stream.read(buffer),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(socket) => socket.write(bytes),
            Stream::Tls(stream) => stream.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(socket) => socket.flush(),
            Stream::Tls(stream) => stream.flush(),
        }
    }
}

impl Stream {
    fn socket(&mut self) -> &mut Socket {
        match self {
            Stream::Plain(socket) => socket,
            Stream::Tls(stream) => &mut stream.sock,
        }
    }
}

impl Connection {
    /// Connects to `host:port` before `deadline`, through TLS when `tls`
    /// is given; its answers are read within `limits`.
    pub fn open(
        host: &str,
        port: u16,
        tls: Option<&Arc<ClientConfig>>,
        deadline: Instant,
        limits: Limits,
    ) -> io::Result<Connection> {
        // The first address's failure is told: `localhost`'s ::1 on a
        // node without IPv6 would hide 127.0.0.1's refusal.
        let mut first: Option<io::Error> = None;
        let mut connected = None;
        for address in lookup(host, port, deadline)? {
            match Socket::connect(&address, deadline) {
                Ok(socket) => {
                    connected = Some(socket);
                    break;
                }
                // Out of time, or stopped: no other address will do better.
                Err(e) if e.kind() == io::ErrorKind::TimedOut || interrupted(&e).is_some() => {
                    return Err(e)
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        let socket = match connected {
            Some(socket) => socket,
            None => {
                return Err(first.unwrap_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"))
                }))
            }
        };
        let stream = match tls {
            None => Stream::Plain(socket),
            Some(config) => {
                let name = ServerName::try_from(host.to_owned())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                let session =
                    ClientConnection::new(Arc::clone(config), name).map_err(io::Error::other)?;
                Stream::Tls(Box::new(StreamOwned::new(session, socket)))
            }
        };
        Ok(Connection {
            stream: BufReader::new(stream),
            // The Host header names the port, and brackets an IPv6 address.
            host: match host.contains(':') {
                true => format!("[{host}]:{port}"),
                false => format!("{host}:{port}"),
            },
            limits,
        })
    }

    /// Sends a `method` request for `path`, with `headers` and a JSON
    /// `body` if one is given, and reads the answer before `deadline`.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        deadline: Instant,
    ) -> io::Result<Answer> {
        remaining(deadline)?;
        self.stream.get_mut().socket().set_deadline(deadline);
        http::write_request(
            self.stream.get_mut(),
            method,
            &self.host,
            path,
            headers,
            body,
        )?;
        http::read_answer(&mut self.stream, self.limits)
    }

    /// POSTs `body` to `path`, with `token` as its `Authorization` if one
    /// is given, and reads the answer before `deadline`: its status and
    /// its body.
    pub fn post(
        &mut self,
        path: &str,
        token: Option<&str>,
        body: &[u8],
        deadline: Instant,
    ) -> io::Result<(u16, Vec<u8>)> {
        let authorization: Vec<(&str, &str)> =
            token.map(|t| ("Authorization", t)).into_iter().collect();
        let answer = self.request("POST", path, &authorization, Some(body), deadline)?;
        Ok((answer.status, answer.body))
    }

    /// GETs `path` and reads the answer before `deadline`: its status and
    /// its body (the member's `/metrics`, say).
    pub fn get(&mut self, path: &str, deadline: Instant) -> io::Result<(u16, Vec<u8>)> {
        let answer = self.request("GET", path, &[], None, deadline)?;
        Ok((answer.status, answer.body))
    }
}

/// Whether `host:port` speaks the other scheme than the one tried
/// (`tried_tls`): plain HTTP when TLS was tried, TLS when plain HTTP was.
/// Asked, before `deadline`, of a member that closed a new connection
/// without a word, as one does a connection it cannot read: an endpoint
/// given with the wrong scheme is a setting to fix, not a member to wait
/// for.
pub fn speaks_the_other_scheme(host: &str, port: u16, tried_tls: bool, deadline: Instant) -> bool {
    if tried_tls {
        // Any HTTP answer at all is plain HTTP.
        return Connection::open(host, port, None, deadline, PROBE)
            .and_then(|mut plain| plain.get("/version", deadline))
            .is_ok();
    }
    // No certificate is trusted: a member that sends one, or refuses the
    // hello with an alert, speaks TLS.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(builder) =
        ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = Arc::new(
        builder
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    );
    let answer = Connection::open(host, port, Some(&config), deadline, PROBE)
        .and_then(|mut tls| tls.get("/version", deadline));
    let Err(e) = answer else {
        return false;
    };
    matches!(
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_))
    )
}

/// What a probe of the scheme reads: any answer at all says enough.
const PROBE: Limits = Limits {
    line: 8 * 1024,
    headers: 64,
    body: 64 * 1024,
};

/// The addresses of `host` (a name, or an address), looked up before
/// `deadline`. `localhost` is this host's loopback, 127.0.0.1 and ::1,
/// whatever a resolver would answer: clear text is allowed to it alone.
/// The system's resolver may wait far longer for a server that does not
/// answer, so another name is looked up in a thread of its own, left to
/// finish alone if it is late or a termination request comes first.
fn lookup(host: &str, port: u16, deadline: Instant) -> io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if is_localhost(host) {
        return Ok(vec![
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port),
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), port),
        ]);
    }
    stopped("looking up a peer's name")?;
    let (answer, answered) = std::sync::mpsc::channel();
    let name = host.to_owned();
    std::thread::Builder::new()
        .name("http-lookup".into())
        .spawn(move || {
            let found = (name.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect);
            // The caller may have gone on without it.
            let _ = answer.send(found);
        })?;
    loop {
        // In slices, to see a termination request: the signalfd is this
        // thread's to read.
        let left = remaining(deadline).map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("looking up {host} took longer than the time left"),
            )
        })?;
        match answered.recv_timeout(left.min(LOOKUP_SLICE)) {
            Ok(found) => return found,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(io::Error::other(format!("looking up {host} failed")))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        stopped("looking up a peer's name")?;
    }
}

/// How often a lookup looks for a termination request.
const LOOKUP_SLICE: Duration = Duration::from_millis(50);

/// Whether `host` names this host's loopback: `localhost`, in any case,
/// with or without the root's dot.
pub fn is_localhost(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
}

/// Whether `host` is this host's own loopback (127.0.0.0/8, ::1 or
/// `localhost`), which no other host sees: clear text may go to it.
pub fn is_loopback(host: &str) -> bool {
    is_localhost(host) || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;

    const LIMITS: Limits = Limits {
        line: 8 * 1024,
        headers: 64,
        body: 1 << 20,
    };

    /// A client configuration that trusts no certificate: enough for a
    /// peer that never finishes the handshake.
    fn tls_trusting_nothing() -> Arc<ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
    }

    /// A peer that accepts a connection, reads what comes, and sends
    /// `head`, then `trickle` a byte each `every`.
    fn slow_peer(head: &'static [u8], trickle: usize, every: Duration) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(head);
            for _ in 0..trickle {
                std::thread::sleep(every);
                if stream.write_all(b"\x00").is_err() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_secs(30));
        });
        port
    }

    #[test]
    fn a_tls_peer_that_never_speaks_or_trickles_its_handshake_ends_by_the_deadline() {
        // Accepts, reads the client's hello, says nothing.
        let silent = slow_peer(b"", 0, Duration::ZERO);
        // A handshake record announced whole (16 KiB), its bytes sent one
        // by one: rustls reads the socket many times inside one read.
        let trickling = slow_peer(b"\x16\x03\x03\x40\x00", 1000, Duration::from_millis(20));
        for port in [silent, trickling] {
            let started = Instant::now();
            let deadline = started + Duration::from_millis(500);
            let error = Connection::open(
                "127.0.0.1",
                port,
                Some(&tls_trusting_nothing()),
                deadline,
                LIMITS,
            )
            .and_then(|mut c| c.get("/version", deadline))
            .unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::TimedOut, "{error}");
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
        }
    }

    #[test]
    fn a_request_a_peer_could_split_is_refused_and_the_connection_stays_fit() {
        let port = server(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut connection = Connection::open("127.0.0.1", port, None, deadline, LIMITS).unwrap();
        for (path, token) in [
            ("/ports/p\r\nX-Evil: 1", "t"),
            ("/ports/p x", "t"),
            ("/ports", "t\r\nX-Evil: 1"),
            ("/ports", "t\rX"),
            ("/ports", "t\u{7f}"),
        ] {
            let e = connection
                .request("GET", path, &[("X-Auth-Token", token)], None, deadline)
                .unwrap_err();
            assert_eq!(
                e.kind(),
                io::ErrorKind::InvalidInput,
                "{path:?} {token:?}: {e}"
            );
            // The token is never told.
            assert!(
                !e.to_string().contains("Evil") || path.contains("Evil"),
                "{e}"
            );
        }
        // Nothing of them was sent: the server reads this one as the first.
        let answer = connection
            .request("GET", "/ports", &[("X-Auth-Token", "t")], None, deadline)
            .unwrap();
        assert_eq!((answer.status, answer.body.as_slice()), (200, &b"{}"[..]));
    }

    #[test]
    fn localhost_is_the_loopback_whatever_a_resolver_says() {
        let deadline = Instant::now() + Duration::from_secs(5);
        for name in ["localhost", "LOCALHOST", "localhost."] {
            assert_eq!(
                lookup(name, 80, deadline).unwrap(),
                [
                    "127.0.0.1:80".parse::<SocketAddr>().unwrap(),
                    "[::1]:80".parse().unwrap()
                ]
            );
            assert!(is_loopback(name));
        }
        for other in ["localhost.example", "127.0.0.1.nip.io", "10.0.0.1", "me"] {
            assert!(!is_loopback(other), "{other}");
        }
        assert!(is_loopback("127.0.0.2") && is_loopback("::1"));
    }

    /// Serves one connection with the answers given, each after reading
    /// one request.
    fn server(answers: Vec<&'static [u8]>) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            for answer in answers {
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).unwrap();
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap();
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                writer.write_all(answer).unwrap();
            }
        });
        port
    }

    #[test]
    fn answers_sized_by_length_or_chunked_on_one_connection() {
        let port = server(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":1}\r\n0\r\n\r\n",
        ]);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut connection = Connection::open("127.0.0.1", port, None, deadline, LIMITS).unwrap();
        assert_eq!(
            connection
                .post("/v3/kv/range", None, b"{}", deadline)
                .unwrap(),
            (200, b"{}".to_vec())
        );
        let (status, body) = connection
            .post("/v3/kv/range", None, b"{\"k\":1}", deadline)
            .unwrap();
        assert_eq!((status, body.as_slice()), (503, &b"{\"a\":1}"[..]));
        // The peer has closed: the next request fails, it does not hang.
        assert!(connection
            .post("/v3/kv/range", None, b"{}", deadline)
            .is_err());
    }

    #[test]
    fn a_silent_peer_is_bounded_by_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(1);
        let mut connection = Connection::open("127.0.0.1", port, None, deadline, LIMITS).unwrap();
        let error = connection
            .post("/v3/kv/range", None, b"{}", deadline)
            .unwrap_err();
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(4));
        drop(listener);
    }

    #[test]
    fn a_peer_that_trickles_its_answer_is_bounded_by_the_deadline_as_a_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n");
            // A byte each 50 ms: every read gets one well within its time.
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(50));
                if stream.write_all(b" ").is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        let deadline = started + Duration::from_millis(400);
        let mut connection = Connection::open("127.0.0.1", port, None, deadline, LIMITS).unwrap();
        assert!(connection
            .post("/v3/kv/range", None, b"{}", deadline)
            .is_err());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn an_address_needs_no_lookup() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let found = lookup("127.0.0.1", 2379, deadline).unwrap();
        assert_eq!(found, ["127.0.0.1:2379".parse::<SocketAddr>().unwrap()]);
        let found = lookup("::1", 2379, deadline).unwrap();
        assert_eq!(found, ["[::1]:2379".parse::<SocketAddr>().unwrap()]);
    }
}
