//! A client's TCP socket whose every wait (the connection, each read, each
//! write) ends by one deadline or at a termination request. It sits under
//! rustls, so that the TLS handshake and each of the many socket reads a
//! TLS record may take are bounded as plain TCP's are: a peer that
//! accepts and never speaks, or trickles its answer a byte at a time,
//! cannot hold a call past its deadline. A termination request the
//! plugin has not taken in hand ([`signals::pending`]) ends every wait,
//! the ones after it too, until the plugin takes it in hand.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::signals::{self, Interrupted};
use crate::sys::{self, pollfd};

/// A connected socket, non-blocking underneath, blocking for its callers
/// until the deadline.
pub struct Socket {
    tcp: TcpStream,
    deadline: Instant,
}

impl Socket {
    /// Connects to `address` before `deadline`.
    pub fn connect(address: &SocketAddr, deadline: Instant) -> io::Result<Socket> {
        stopped("connecting to a peer")?;
        let tcp = sys::connect_started(address)?;
        let socket = Socket { tcp, deadline };
        // Writable once connected, or once the connection failed.
        socket.wait(libc::POLLOUT)?;
        if let Some(failed) = socket.tcp.take_error()? {
            return Err(failed);
        }
        socket.tcp.set_nodelay(true)?;
        Ok(socket)
    }

    /// Bounds what follows by `deadline`, the next request's.
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// Waits until the socket is ready for `events` (or has failed), the
    /// deadline passes (`TimedOut`), or a termination request comes (an
    /// error holding [`Interrupted`]).
    fn wait(&self, events: libc::c_short) -> io::Result<()> {
        loop {
            stopped("waiting for a peer (etcd, the controller, Keystone)")?;
            let left = remaining(self.deadline)?;
            let mut fds = [
                pollfd(Some(self.tcp.as_raw_fd()), events),
                pollfd(signals::fd().map(|fd| fd.as_raw_fd()), libc::POLLIN),
            ];
            sys::poll(&mut fds, Some(left))?;
            if fds[0].revents != 0 {
                return Ok(());
            }
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.when_ready(libc::POLLIN, |mut tcp| tcp.read(buffer))
    }
}

impl Write for Socket {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.when_ready(libc::POLLOUT, |mut tcp| tcp.write(bytes))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Socket {
    /// `io` on the socket, tried again each time it is ready for `events`
    /// until it does not have to wait.
    fn when_ready<T>(
        &self,
        events: libc::c_short,
        mut io: impl FnMut(&TcpStream) -> io::Result<T>,
    ) -> io::Result<T> {
        loop {
            remaining(self.deadline)?;
            match io(&self.tcp) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait(events)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                done => return done,
            }
        }
    }
}

/// An error holding [`Interrupted`] if a termination request is pending,
/// said to have come while `during`.
pub fn stopped(during: &'static str) -> io::Result<()> {
    match signals::pending() {
        Some(signal) => Err(io::Error::other(Interrupted { signal, during })),
        None => Ok(()),
    }
}

/// The time left before `deadline`; none left is a timeout.
pub fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::Error::new(io::ErrorKind::TimedOut, "out of time"))
    } else {
        Ok(left)
    }
}

/// The termination request an I/O error stands for, if it stands for one.
pub fn interrupted(error: &io::Error) -> Option<&Interrupted> {
    error.get_ref()?.downcast_ref::<Interrupted>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_connection_to_a_closed_port_is_refused_at_once() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let e = Socket::connect(&address, Instant::now() + Duration::from_secs(5))
            .err()
            .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }

    #[test]
    fn a_connection_the_peer_ended_fails_at_once_not_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let started = Instant::now();
        let mut socket = Socket::connect(&address, started + Duration::from_secs(20)).unwrap();
        drop(listener.accept().unwrap());
        // The first writes may be taken before the peer's reset comes back.
        let error = loop {
            match socket.write_all(b"x") {
                Ok(_) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn reads_and_writes_go_through_and_a_silent_peer_times_out() {
        let listener = TcpListener::bind("[::1]:0")
            .or_else(|_| TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let address = listener.local_addr().unwrap();
        let started = Instant::now();
        let mut socket = Socket::connect(&address, started + Duration::from_secs(1)).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        socket.write_all(b"ping").unwrap();
        let mut got = [0; 4];
        peer.read_exact(&mut got).unwrap();
        peer.write_all(b"pong").unwrap();
        socket.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"pong");
        // Nothing more comes: the read ends at the deadline.
        let e = socket.read(&mut got).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(started.elapsed() < Duration::from_secs(4));
        // A new deadline, a new wait.
        socket.set_deadline(Instant::now() + Duration::from_secs(5));
        peer.write_all(b"more").unwrap();
        socket.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"more");
    }
}
